"""The engine's view of the nodes (engine/facts/observe.py): whole-table reads carry no node address (the
formatted sinfo groups nodes), so a node of a job must still come with the address and port its
own read gives — the probe connects to them."""

from __future__ import annotations

from collections.abc import Collection

from supervisor.domain.cluster import ClusterSnapshot, JobInfo, JobState, NodeInfo, NodeState
from supervisor.domain.health.findings import HeartbeatSettings
from supervisor.domain.health.quarantine import QuarantineSettings
from supervisor.domain.records import AttemptRecord, RunRecord
from supervisor.domain.run import RunState
from supervisor.engine.facts.nodes import NodeWatch
from supervisor.engine.facts.observe import Observer
from supervisor.engine.facts.probes import ProbeTracker
from supervisor.engine.watch.nulls import NoCheckpoints, NoHealthFeed, NoProgress
from supervisor.testing.kit.clock import ManualClock
from supervisor.testing.kit.specs import spec

SPEC = spec(script="/s.sh", nodes=1)
JOB = JobInfo(7, "llm", JobState.RUNNING, nodes=("n4",), partition="main")


class Store:
    """The three reads ``Observer.snapshot`` makes of the store."""

    def runs(self, active_only: bool = False) -> list[RunRecord]:
        attempt = AttemptRecord("llm", 0, 7, 0, 900.0)  # submitted, not yet seen running: it just started
        return [RunRecord(SPEC, RunState.QUEUED, attempt=attempt)]

    def verdicts(self) -> list:
        return []

    def open_actions(self) -> list:
        return []


class GroupedSlurm:
    """As the formatted reads answer: the whole table without addresses, named nodes with them."""

    def __init__(self) -> None:
        self.reads: list[bool | frozenset[str]] = []

    def snapshot(self, include_nodes: bool | Collection[str] = True) -> ClusterSnapshot:
        self.reads.append(include_nodes if isinstance(include_nodes, bool) else frozenset(include_nodes))
        names = [f"n{i}" for i in range(1, 6)] if include_nodes is True else sorted(include_nodes or ())
        own = include_nodes is not True
        nodes = {
            n: NodeInfo(n, NodeState.ALLOCATED if n == "n4" else NodeState.IDLE, frozenset(), "", ("main",),
                        address="10.0.0.4" if own else "", port=7004 if own else None)
            for n in names
        }  # fmt: skip
        return ClusterSnapshot(1000.0, {7: JOB}, nodes)


def observer(slurm: GroupedSlurm) -> Observer:
    return Observer(
        scheduler=slurm, store=Store(), clock=ManualClock(), probes=ProbeTracker(None, 5.0), progress=NoProgress(),
        checkpoints=NoCheckpoints(), nodes=NodeWatch(NoHealthFeed(), HeartbeatSettings(), 600.0),
        quarantine=QuarantineSettings(), node_refresh_ticks=1,
    )  # fmt: skip


def test_a_whole_read_still_gives_the_jobs_nodes_their_addresses():
    """Before: the first tick read the whole table (no addresses) and stopped there; the node of
    the job that had just started was probed at the default port and found dead (tests/e2e)."""
    slurm = GroupedSlurm()
    snap = observer(slurm).snapshot(nodes_needed=True)
    assert slurm.reads == [True, frozenset({"n4"})]
    assert (snap.nodes["n4"].address, snap.nodes["n4"].port) == ("10.0.0.4", 7004)
    assert set(snap.nodes) == {"n1", "n2", "n3", "n4", "n5"}  # the whole read is kept too
