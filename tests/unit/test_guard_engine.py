"""The engine through the node guard, on the simulated cluster: two instances (two users) share one
guard, which grants exactly its cluster-wide cap across both (the rest are excluded, not drained,
with a ``mass_fault``); a node faulted for one instance is kept out of the other's next submission;
a refused change is not asked again every tick; a silent guard does not stop the tick.

The guard is the real one (policy, service, SQLite memory, audit log) reached through the real
client with the socket replaced by a direct call (``GuardClient(transport=...)``); the real socket
is in tests/unit/test_guard_socket.py, both on real Slurm in tests/slurm/test_guard_*.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from supervisor.adapters.guard_client import GuardClient
from supervisor.adapters.sqlite import SqliteStore
from supervisor.domain.cluster import ClusterSnapshot, JobInfo, NodeChange
from supervisor.domain.health.quarantine import QuarantineSettings
from supervisor.domain.records import EventKind
from supervisor.domain.run import RunSpec
from supervisor.guard.audit import AuditLog
from supervisor.guard.memory import GuardMemory
from supervisor.guard.policy import Caller, Limits
from supervisor.guard.service import Guard
from supervisor.ports import TransientError
from supervisor.sim.clock import VirtualClock
from supervisor.sim.slurm.cluster import SimCluster
from supervisor.sim.slurm.probe import SimProbe
from supervisor.testing.kit.engine import EngineHarness

USERS = {"a": Caller(2001, 2001, 1, "ssv-a", frozenset()), "b": Caller(2002, 2002, 2, "ssv-b", frozenset())}


def spec(name: str, nodes: int = 2) -> RunSpec:
    return RunSpec(name=name, script="/train.sbatch", partition="main", nodes=nodes, max_restarts=5)


class OwnedCluster:
    """The guard's view of the simulated cluster: a job belongs to the user whose instance submitted
    it (its tag names the run; run "a-..." is ssv-a's)."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster

    def snapshot(self, include_nodes: bool = True) -> ClusterSnapshot:
        snap = self.cluster.inspect()
        return replace(snap, jobs={i: replace(j, user_id=self._owner(j)) for i, j in snap.jobs.items()})

    def jobs_on(self, node: str) -> tuple[JobInfo, ...]:
        return tuple(j for j in self.snapshot(include_nodes=False).jobs.values() if node in j.nodes)

    def _owner(self, job: JobInfo) -> int | None:
        parts = job.comment.split(":")
        user = USERS.get(parts[1].split("-")[0]) if len(parts) > 1 else None
        return user.uid if user else None

    def set_node_state(self, node: str, change: NodeChange, reason: str) -> None:
        self.cluster.set_node_state(node, change, reason)


class World:
    def __init__(self, tmp_path: Path, nodes: int = 8, max_drains: int = 2) -> None:
        self.clock = VirtualClock()
        self.cluster = SimCluster(self.clock, nodes, "main")
        self.audit_path = tmp_path / "guard" / "audit.jsonl"
        self.audit_path.parent.mkdir()
        self.guard = Guard(
            slurm=OwnedCluster(self.cluster),  # type: ignore[arg-type]
            memory=GuardMemory(tmp_path / "guard"),
            audit=AuditLog(self.audit_path),
            limits=Limits(max_drains=max_drains),
            quarantine=QuarantineSettings(faults=1),
            clock=self.clock.now,
        )
        self.tmp = tmp_path
        self.instances: dict[str, EngineHarness[SimCluster]] = {}
        self.silent = False

    def instance(self, user: str, *specs: RunSpec) -> EngineHarness[SimCluster]:
        h = EngineHarness(
            self.tmp / user,
            clock=self.clock,
            scheduler=self.cluster,
            open_store=SqliteStore,
            specs=specs,
            probe=SimProbe(self.cluster),
            view=self.cluster.inspect,
            interval=0.5,
        )
        h.guard = GuardClient(transport=lambda request: self._ask(USERS[user], request))
        h.new_engine()
        self.instances[user] = h
        return h

    def _ask(self, caller: Caller, request: object) -> dict:
        if self.silent:
            raise TransientError("the node guard did not answer")
        return json.loads(self.guard.handle_line(caller, json.dumps(request).encode()))

    def tick(self, n: int = 1) -> None:
        for _ in range(n):
            for h in self.instances.values():
                assert h.tick().ok

    def until(self, predicate, limit: int = 200) -> None:
        for _ in range(limit):
            if predicate():
                return
            self.tick()
        raise AssertionError("condition not reached")

    def audit(self) -> list[dict]:
        return [json.loads(line) for line in self.audit_path.read_text().splitlines()]

    def drained_by_us(self) -> set[str]:
        nodes = self.cluster.inspect().nodes
        return {n for n, i in nodes.items() if i.drained and i.reason.startswith("slurm-supervisor: run ")}


def test_two_instances_get_exactly_the_cluster_wide_cap_and_the_rest_is_a_mass_fault(tmp_path):
    w = World(tmp_path, nodes=8, max_drains=2)
    a, b = w.instance("a", spec("a-llm")), w.instance("b", spec("b-llm"))
    w.until(lambda: a.running() and b.running())
    victims = [*a.run().attempt.nodes, b.run().attempt.nodes[0]]
    for node in victims:
        w.cluster.crash_node(node)
    w.until(lambda: a.run().attempt.seq >= 1 and b.run().attempt.seq >= 1, limit=400)
    w.tick(20)

    granted = {x["node"] for x in w.audit() if x["granted"]}
    capped = [x for x in w.audit() if x["rule"] == "cluster-cap"]
    assert len(granted) == 2 and granted == w.drained_by_us() and granted < set(victims)
    (left_out,) = set(victims) - granted
    # Each instance asks about it once, not again every tick. A capped request is no fault (it took
    # nothing out of service: issue 32), so the other instance may land on the node and ask too.
    asked = [(x["user"], x["node"]) for x in capped]
    assert {node for _, node in asked} == {left_out} and len(asked) == len(set(asked))
    # The run that asked keeps the node out, not drained, with one mass_fault (a page) on record.
    owner = {"a": a, "b": b}[capped[0]["run"][0]]
    (mass,) = owner.events(EventKind.MASS_FAULT)
    assert left_out in mass.message and "cluster-wide cap" in mass.message
    assert left_out in owner.run().excluded
    assert any(left_out in e.message for e in owner.events(EventKind.NODE_EXCLUDED))
    assert sum(len(h.events(EventKind.MASS_FAULT)) for h in (a, b)) == len(asked)
    assert left_out in w.cluster.job_request(owner.run().attempt.job_id).exclude


def test_a_node_faulted_for_one_instance_is_kept_out_of_the_others_next_submission(tmp_path):
    w = World(tmp_path, nodes=4, max_drains=8)
    a = w.instance("a", spec("a-llm"))
    w.until(a.running)
    victim = a.run().attempt.nodes[0]
    w.cluster.crash_node(victim)
    w.until(lambda: a.running(seq=1))
    assert victim in w.drained_by_us()
    w.cluster.repair_node(victim)  # an admin repairs and resumes it with scontrol, not the guard
    assert not w.cluster.inspect().nodes[victim].drained
    b = w.instance("b", spec("b-llm"))
    w.until(lambda: b.run().attempt is not None)
    assert b.store.node_faults(0) == []  # b's own memory knows nothing of it
    assert victim in w.cluster.job_request(b.run().attempt.job_id).exclude
    (quarantined,) = json.loads(w.guard.handle_line(USERS["b"], b'{"op": "QUARANTINE"}'))["quarantined"]
    assert quarantined["node"] == victim and quarantined["faults"][0]["run"] == "ssv-a/a-llm"


def test_a_refused_change_excludes_the_node_and_is_not_asked_again_every_tick(tmp_path):
    w = World(tmp_path, nodes=4)
    c = w.instance("a", spec("c-llm"))  # run "c-...": no user owns its jobs in the guard's view
    w.until(c.running)
    victim = c.run().attempt.nodes[0]
    w.cluster.crash_node(victim)
    w.until(lambda: c.running(seq=1))
    w.tick(20)
    refused = [x for x in w.audit() if x["node"] == victim]
    assert [(x["op"], x["rule"]) for x in refused] == [("DOWN", "not-own-node")]
    assert victim in c.run().excluded and victim not in w.drained_by_us()
    assert any("refused (not-own-node)" in e.message for e in c.events(EventKind.NODE_EXCLUDED))


def test_a_silent_guard_leaves_the_shared_quarantine_out_and_the_tick_goes_on(tmp_path):
    w = World(tmp_path, nodes=4)
    a = w.instance("a", spec("a-llm"))
    w.silent = True
    w.until(a.running)
    assert a.tick().ok


def test_without_a_guard_node_changes_go_to_slurm_as_before(tmp_path):
    w = World(tmp_path, nodes=4)
    a = w.instance("a", spec("a-llm"))
    a.guard = None
    a.new_engine()
    w.until(a.running)
    victim = a.run().attempt.nodes[0]
    w.cluster.crash_node(victim)
    w.until(lambda: a.running(seq=1))
    assert victim in w.drained_by_us() and not w.audit_path.read_text()
