"""Issue 32, finding 12: the Slurm reason on a node the supervisor changed names the account that
asked, not only a run name any caller may choose; an instance reads a node as one it changed itself
only when the reason names its own account and run. Before: mallory's granted DRAIN under the run
name ``team-llm-70b`` wrote ``slurm-supervisor: run team-llm-70b: …`` and alice's instance with a
run of that name read the node as drained by itself."""

from __future__ import annotations

import json
from pathlib import Path

from supervisor.adapters.guard_client import GuardClient
from supervisor.domain.cluster import ClusterSnapshot, JobInfo, JobState, NodeChange, NodeInfo, NodeState
from supervisor.domain.decide.policy import Observation, Policy, decide
from supervisor.domain.health.quarantine import QuarantineSettings
from supervisor.domain.observation import account_label, marked_by_us, node_reason
from supervisor.domain.records import AttemptRecord, RunRecord
from supervisor.domain.run import RunState
from supervisor.guard.audit import AuditLog
from supervisor.guard.memory import GuardMemory
from supervisor.guard.policy import Caller, Limits
from supervisor.guard.service import Guard
from supervisor.testing.kit.specs import spec

ALICE = Caller(2001, 2001, 11, "alice", frozenset({"alice"}))
MALLORY = Caller(2002, 2002, 12, "mallory", frozenset({"mallory"}))


class NodeSlurm:
    """The guard's Slurm: mallory's job on n9, alice's on n1; the reasons the guard wrote."""

    def __init__(self) -> None:
        self.reasons: dict[str, str] = {}

    def jobs_on(self, node: str) -> tuple[JobInfo, ...]:
        uid = MALLORY.uid if node == "n9" else ALICE.uid
        return (JobInfo(job_id=uid, name="j", state=JobState.RUNNING, nodes=(node,), user_id=uid),)

    def set_node_state(self, node: str, change: NodeChange, reason: str) -> None:
        self.reasons[node] = reason


def guard(tmp_path: Path, slurm: NodeSlurm) -> Guard:
    return Guard(
        slurm=slurm,  # type: ignore[arg-type]
        memory=GuardMemory(tmp_path / "state"),
        audit=AuditLog(tmp_path / "audit.jsonl"),
        limits=Limits(frozenset(), max_drains=8, window_s=3600),
        quarantine=QuarantineSettings(),
        clock=lambda: 1_000_000.0,
    )


def test_the_guards_reason_names_the_callers_account_and_another_instance_does_not_read_it_as_its_own(tmp_path):
    slurm = NodeSlurm()
    line = {"op": "DRAIN", "node": "n9", "run": "team-llm-70b", "cause": "XID 79 - confirmed by infra"}
    answer = json.loads(guard(tmp_path, slurm).handle_line(MALLORY, json.dumps(line).encode()))
    assert answer["granted"], answer
    reason = slurm.reasons["n9"]
    assert reason == "slurm-supervisor: run mallory/team-llm-70b: XID 79 - confirmed by infra"
    assert not marked_by_us(reason, "alice", "team-llm-70b")
    assert marked_by_us(reason, "mallory", "team-llm-70b")


def test_the_daemons_reason_goes_through_the_guard_unchanged(tmp_path):
    """The daemon builds its reason with its own account; the guard rebuilds the same one from the
    caller the kernel names, so the instance recognises the nodes it changed through the guard."""
    slurm = NodeSlurm()
    g = guard(tmp_path, slurm)
    client = GuardClient(transport=lambda request: json.loads(g.handle_line(ALICE, json.dumps(request).encode())))
    mine = node_reason("alice", "llm", "XID 79 on GPU 3")
    client.set_node_state("n1", NodeChange.DRAIN, "llm", mine)
    assert slurm.reasons["n1"] == mine == "slurm-supervisor: run alice/llm: XID 79 on GPU 3"


def test_an_account_name_outside_the_safe_shape_is_named_by_its_uid():
    assert account_label("alice", 2001) == "alice"
    assert account_label("svc.train@corp", 2003) == "svc.train@corp"
    for odd in ("", "a b", "evil: run x", "x/y", "é", "a" * 40, "uid:7"):
        assert account_label(odd, 7) == "#7", odd


A0 = AttemptRecord("team-llm-70b", 0, 7, 0, 10.0, nodes=("n1", "n2"), started_at=20.0)
JOB = JobInfo(7, "team-llm-70b", JobState.RUNNING, nodes=("n1", "n2"), partition="main")


def boundary(n1_reason: str) -> list[str]:
    """The nodes alice's instance drains at a checkpoint boundary when n1 is drained with this reason."""
    run = RunRecord(
        spec=spec(name="team-llm-70b", script="/s.sh"),
        state=RunState.RUNNING,
        attempt=A0,
        deferred={"n1": (30.0, "throttling"), "n2": (40.0, "row remap pending")},
    )
    nodes = {
        "n1": NodeInfo("n1", NodeState.ALLOCATED, frozenset({"DRAIN"}), n1_reason, ("main",)),
        "n2": NodeInfo("n2", NodeState.ALLOCATED, frozenset(), "", ("main",)),
    }
    obs = Observation(ClusterSnapshot(100.0, {7: JOB}, nodes), checkpoint_at={run.name: 50.0}, account="alice")
    drains = [a for a in decide(run, obs, Policy(drains_left=4)).actions if getattr(a, "change", None)]
    assert all(a.reason.startswith("slurm-supervisor: run alice/team-llm-70b: ") for a in drains)
    return [a.node for a in drains]


def test_a_node_another_account_drained_under_the_same_run_name_is_not_the_instances_own():
    assert boundary("slurm-supervisor: run alice/team-llm-70b: throttling") == ["n2"]
    assert boundary("slurm-supervisor: run mallory/team-llm-70b: throttling") == ["n1", "n2"]
    assert boundary("slurm-supervisor: run team-llm-70b: throttling") == ["n1", "n2"]  # no account: anyone's
