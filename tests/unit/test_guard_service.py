"""The guard's work on a request: Slurm asked at the moment of the request, the node changed with the
guard's own reason, every request audited, the shared bad-node memory, the guard's config file.

Slurm here is a small stateful fake of the guard's NodeSlurm (the jobs on a node, a node's state
change); the real one is in tests/slurm/test_guard_slurm.py."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from supervisor.config import ConfigError
from supervisor.domain.cluster import JobInfo, JobState, NodeChange
from supervisor.domain.health.quarantine import QuarantineSettings
from supervisor.guard.audit import AuditLog
from supervisor.guard.config import load_guard_config
from supervisor.guard.memory import GuardMemory
from supervisor.guard.policy import Caller, Limits
from supervisor.guard.service import Guard, parse_request
from supervisor.ports import PermanentError, TransientError
from supervisor.testing.kit.clock import ManualClock

ALICE = Caller(1001, 1001, 11, "alice", frozenset({"alice"}))
BOB = Caller(1002, 1002, 12, "bob", frozenset({"bob"}))
ADMIN = Caller(1003, 1003, 13, "carol", frozenset({"hpc-admins"}))


@dataclass
class FakeSlurm:
    jobs: dict[int, JobInfo] = field(default_factory=dict)
    reasons: dict[str, tuple[str, str]] = field(default_factory=dict)  # node -> (state, reason)
    changes: list[tuple[str, str]] = field(default_factory=list)  # (node, state) in the order made
    fail: Exception | None = None
    reads: list[str] = field(default_factory=list)  # the nodes asked about, in order
    on_change: dict[tuple[str, str], JobInfo] = field(default_factory=dict)  # (node, state) -> a job that starts then

    def run(self, job_id: int, uid: int, *nodes: str) -> None:
        self.jobs[job_id] = JobInfo(job_id=job_id, name="j", state=JobState.RUNNING, nodes=nodes, user_id=uid)

    def jobs_on(self, node: str) -> tuple[JobInfo, ...]:
        self.reads.append(node)
        if self.fail is not None:
            raise self.fail
        return tuple(j for j in self.jobs.values() if node in j.nodes)

    def set_node_state(self, node: str, change: NodeChange, reason: str) -> None:
        self.reasons[node] = (change.value, reason)
        self.changes.append((node, change.value))
        started = self.on_change.pop((node, change.value), None)
        if started is not None:  # another user's job got the node just before the change took effect
            self.jobs[started.job_id] = started


def guard_in(
    directory: Path,
    slurm: object,  # a fake of the guard's NodeSlurm
    limits: Limits,
    quarantine: QuarantineSettings,
    clock: Callable[[], float] = time.time,
) -> Guard:
    """A guard whose memory (``state/``) and audit log lie in ``directory``."""
    return Guard(
        slurm=slurm,  # type: ignore[arg-type]
        memory=GuardMemory(directory / "state"),
        audit=AuditLog(directory / "audit.jsonl"),
        limits=limits,
        quarantine=quarantine,
        clock=clock,
    )


@pytest.fixture
def slurm() -> FakeSlurm:
    s = FakeSlurm()
    s.run(7, ALICE.uid, "n1", "n2")
    s.run(8, BOB.uid, "n3", "n4")
    return s


@pytest.fixture
def guard(tmp_path: Path, slurm: FakeSlurm, clock: ManualClock) -> Guard:
    return guard_in(
        tmp_path,
        slurm,
        Limits(frozenset({"hpc-admins"}), max_drains=2, window_s=3600),
        QuarantineSettings(faults=1, base_s=86400),
        clock.now,
    )


def ask(guard: Guard, caller: Caller, **request: str) -> dict:
    return json.loads(guard.handle_line(caller, json.dumps(request).encode()))


def audit(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]


def test_a_granted_drain_changes_slurm_with_the_guards_reason_and_is_audited(guard, slurm, tmp_path):
    answer = ask(guard, ALICE, op="drain", node="n1", run="llm", cause="XID 79 on GPU 3\n")
    assert answer["granted"] and answer["rule"] == "own-job" and answer["job"] == 7
    assert slurm.reasons == {"n1": ("DRAIN", "slurm-supervisor: run alice/llm: XID 79 on GPU 3")}
    (line,) = audit(tmp_path)
    assert {k: line[k] for k in ("uid", "user", "pid", "op", "node", "job", "run", "granted", "rule")} == {
        "uid": 1001, "user": "alice", "pid": 11, "op": "DRAIN", "node": "n1", "job": 7, "run": "llm",
        "granted": True, "rule": "own-job",
    }  # fmt: skip
    assert line["cause"] == "XID 79 on GPU 3\n" and line["reason"] == "slurm-supervisor: run alice/llm: XID 79 on GPU 3"
    assert line["time"].endswith("Z")


def test_refusals_touch_nothing_and_are_audited(guard, slurm, tmp_path):
    assert ask(guard, ALICE, op="DRAIN", node="n3", run="llm", cause="x")["rule"] == "not-own-node"  # bob's
    assert ask(guard, ALICE, op="DOWN", node="n9", run="llm", cause="x")["rule"] == "not-own-node"  # idle
    assert ask(guard, ALICE, op="RESUME", node="n1")["rule"] == "not-own-remedy"  # never drained by alice
    assert slurm.reasons == {}
    guard.audit.flush_due(float("inf"))  # a repeat of one caller's refusal is folded into one line
    assert [(a["node"], a["granted"], a["rule"], a.get("repeats")) for a in audit(tmp_path)] == [
        ("n3", False, "not-own-node", None),
        ("n1", False, "not-own-remedy", None),
        ("n9", False, "not-own-node", 1),
    ]


@pytest.mark.parametrize(
    "line",
    [b"not json", b"[1, 2]", b'{"op": 3}', b'{"op": "DRAIN", "node": ["n1"]}', b"\xff\xfe", b"x" * 9000],
)
def test_unreadable_requests_are_refused_and_audited(guard, slurm, tmp_path, line):
    answer = json.loads(guard.handle_line(ALICE, line))
    assert (answer["granted"], answer["rule"]) == (False, "bad-request")
    assert audit(tmp_path)[-1]["rule"] == "bad-request" and slurm.reasons == {}


def test_slurm_is_asked_at_the_moment_of_each_request(guard, slurm):
    assert ask(guard, ALICE, op="DRAIN", node="n3", run="llm", cause="x")["rule"] == "not-own-node"
    del slurm.jobs[8]  # bob's job ended; alice's job 9 now runs on n3
    slurm.run(9, ALICE.uid, "n3")
    assert ask(guard, ALICE, op="DRAIN", node="n3", run="llm", cause="x")["rule"] == "own-job"
    assert slurm.reads == ["n3", "n3"]  # the node asked about, nothing else


def test_slurm_unreachable_is_a_transient_refusal(guard, slurm, tmp_path):
    slurm.fail = TransientError("squeue timed out")  # a port error: answered, audited
    answer = ask(guard, ALICE, op="DRAIN", node="n1", run="llm", cause="x")
    assert (answer["granted"], answer["rule"], answer["transient"]) == (False, "slurm-error", True)
    slurm.fail = PermanentError("squeue printed garbage")
    assert ask(guard, ALICE, op="DRAIN", node="n1", run="llm", cause="x")["transient"] is False
    guard.audit.flush_due(float("inf"))
    assert [(a["rule"], a.get("repeats")) for a in audit(tmp_path)] == [("slurm-error", None), ("slurm-error", 1)]


def test_the_cap_holds_across_callers_and_a_down_then_drain_counts_once(guard, slurm, tmp_path):
    assert ask(guard, ALICE, op="DOWN", node="n1", run="a", cause="dead")["granted"]
    del slurm.jobs[7]  # Slurm requeued alice's job when n1 went down
    assert ask(guard, ALICE, op="DRAIN", node="n1", run="a", cause="dead")["rule"] == "follow-up"
    assert ask(guard, BOB, op="DRAIN", node="n3", run="b", cause="xid")["granted"]
    capped = ask(guard, BOB, op="DRAIN", node="n4", run="b", cause="xid")
    assert (capped["granted"], capped["rule"]) == (False, "cluster-cap")
    assert capped["frees_at"] == pytest.approx(1_000_000.0 + 3600)
    assert set(slurm.reasons) == {"n1", "n3"}
    # The capped node was not taken out: it is no fault. n1's DOWN and DRAIN are one fault.
    held = {q["node"]: q for q in ask(guard, BOB, op="QUARANTINE")["quarantined"]}
    assert set(held) == {"n1", "n3"}
    assert [f["run"] for f in held["n1"]["faults"]] == ["alice/a"]


def test_quarantine_reads_are_not_audited_and_clears_are_for_admins(guard, slurm, tmp_path, clock):
    ask(guard, ALICE, op="DRAIN", node="n1", run="llm", cause="xid")
    lines = len(audit(tmp_path))
    assert [q["node"] for q in ask(guard, BOB, op="QUARANTINE")["quarantined"]] == ["n1"]
    assert len(audit(tmp_path)) == lines
    assert ask(guard, BOB, op="CLEAR", node="n1")["rule"] == "admin-only"
    clock.advance(1)
    assert ask(guard, ADMIN, op="CLEAR", node="n1")["granted"]
    assert ask(guard, BOB, op="QUARANTINE")["quarantined"] == []
    assert audit(tmp_path)[-1]["rule"] == "admin" and audit(tmp_path)[-1]["user"] == "carol"


def test_an_admin_resume_returns_the_node_and_forgives_its_faults(guard, slurm, clock):
    ask(guard, ALICE, op="DRAIN", node="n1", run="llm", cause="xid")
    clock.advance(1)
    assert ask(guard, ADMIN, op="RESUME", node="n1")["granted"]
    assert slurm.reasons["n1"] == ("RESUME", "")
    assert ask(guard, ALICE, op="QUARANTINE")["quarantined"] == []


def test_faults_of_two_instances_add_up(tmp_path, slurm, clock):
    g = guard_in(tmp_path, slurm, Limits(max_drains=10), QuarantineSettings(faults=2), clock.now)
    ask(g, ALICE, op="DRAIN", node="n1", run="a", cause="xid")
    assert ask(g, ALICE, op="QUARANTINE")["quarantined"] == []
    del slurm.jobs[7]  # alice's job ended; bob's job 9 gets n1 (an admin resumed it)
    slurm.run(9, BOB.uid, "n1")
    clock.advance(60)
    ask(g, BOB, op="DRAIN", node="n1", run="b", cause="ecc")
    (held,) = ask(g, ALICE, op="QUARANTINE")["quarantined"]
    assert held["node"] == "n1" and [f["run"] for f in held["faults"]] == ["alice/a", "bob/b"]


def test_memory_and_audit_outlive_the_guard(tmp_path, slurm, clock):
    def fresh() -> Guard:
        return guard_in(tmp_path, slurm, Limits(max_drains=1), QuarantineSettings(faults=1), clock.now)

    assert ask(fresh(), ALICE, op="DRAIN", node="n1", run="a", cause="x")["granted"]
    again = fresh()  # socket activation: a new process per burst of requests
    assert ask(again, BOB, op="DRAIN", node="n3", run="b", cause="x")["rule"] == "cluster-cap"
    assert [a["granted"] for a in audit(tmp_path)] == [True, False]
    assert (tmp_path / "audit.jsonl").stat().st_mode & 0o777 == 0o600


def test_parse_request_upper_cases_the_op_and_keeps_the_rest_as_sent():
    req = parse_request(b'{"op": "drain", "node": "n1", "run": "r", "cause": "a\\nb", "user": "root"}')
    assert (req.op, req.node, req.run, req.cause) == ("DRAIN", "n1", "r", "a\nb")


def test_the_guard_config_file(tmp_path):
    path = tmp_path / "guard.toml"
    path.write_text(
        '[guard]\nstate_dir = "state"\nadmin_groups = ["hpc-admins"]\nmax_drains = 3\nwindow_s = 600\n'
        "[quarantine]\nfaults = 2\nbase_h = 1\n[slurm]\ncommand_timeout_s = 5\n"
    )
    cfg = load_guard_config(path)
    assert cfg.guard.state_dir == tmp_path / "state"
    assert cfg.guard.limits() == Limits(frozenset({"hpc-admins"}), 3, 600.0)
    assert cfg.quarantine.settings().faults == 2 and cfg.quarantine.settings().base_s == 3600
    path.write_text("[guard]\nmax_drains = -1\n")
    with pytest.raises(ConfigError, match="guard.max_drains"):
        load_guard_config(path)
    assert load_guard_config(None).guard.max_drains == 8
