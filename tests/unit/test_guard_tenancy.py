"""Tenants who share a cluster (issue 32), in the guard's service and socket: a shared node is not
an own node, the window between the guard's read and its ``scontrol`` is closed, the shared
quarantine counts an account once per node and only for a change it made, its holds cannot
overflow, and one failing request does not take the guard's answers down for others.

Slurm is the stateful fake of test_guard_service.py; the same attacks on a real Slurm are in
tests/slurm/test_guard_tenants.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs
from test_guard_service import ALICE, BOB, FakeSlurm, ask
from test_guard_socket import served  # noqa: F401 - a fixture

from supervisor.adapters.guard_client import GuardClient
from supervisor.domain.cluster import JobInfo, JobState
from supervisor.domain.health.quarantine import Fault, QuarantineSettings, quarantined
from supervisor.guard.audit import AuditLog
from supervisor.guard.memory import GuardMemory
from supervisor.guard.policy import Limits
from supervisor.guard.service import Guard
from supervisor.testing.kit.clock import ManualClock

DAY = 86400.0


@pytest.fixture
def guard(tmp_path: Path, slurm: FakeSlurm, clock: ManualClock) -> Guard:
    return Guard(
        slurm=slurm,
        memory=GuardMemory(tmp_path / "state"),
        audit=AuditLog(tmp_path / "audit.jsonl"),
        limits=Limits(max_drains=2, window_s=3600),
        quarantine=QuarantineSettings(faults=1, base_s=DAY, max_s=30 * DAY),
        clock=clock.now,
    )


@pytest.fixture
def slurm() -> FakeSlurm:
    s = FakeSlurm()
    s.run(7, ALICE.uid, "n1", "n2")  # alice's job, whole nodes
    s.run(8, BOB.uid, "n3")  # bob's job on n3 ...
    s.run(9, ALICE.uid, "n3")  # ... and a 1-CPU job of alice's next to it (cons_tres shares nodes)
    return s


@pytest.mark.parametrize("op", ["DOWN", "DRAIN"])
def test_a_node_shared_with_another_users_job_is_not_the_callers(guard, slurm, op):
    answer = ask(guard, ALICE, op=op, node="n3", run="llm", cause="xid")
    assert (answer["granted"], answer["rule"]) == (False, "shared-node")
    assert "job 8" in answer["why"] and slurm.changes == []


@pytest.mark.parametrize("state", [JobState.SUSPENDED, JobState.COMPLETING, JobState.UNKNOWN])
def test_a_job_holds_its_node_in_every_state_but_pending_and_ended(guard, slurm, state):
    slurm.jobs[8] = JobInfo(job_id=8, name="j", state=state, nodes=("n3",), user_id=BOB.uid)
    assert ask(guard, ALICE, op="DOWN", node="n3", run="llm", cause="xid")["rule"] == "shared-node"
    slurm.jobs[8] = JobInfo(job_id=8, name="j", state=JobState.COMPLETED, nodes=("n3",), user_id=BOB.uid)
    assert ask(guard, ALICE, op="DOWN", node="n3", run="llm", cause="xid")["rule"] == "own-job"


def test_a_job_that_starts_between_the_read_and_the_down_is_not_killed(guard, slurm):
    """The window between the guard's read and its scontrol: the DOWN is made as DRAIN (no job
    starts on the node from then on), a second read, and the DOWN only if the node is still hers."""
    slurm.on_change[("n1", "DRAIN")] = JobInfo(job_id=10, name="j", state=JobState.RUNNING, nodes=("n1",), user_id=2)
    answer = ask(guard, ALICE, op="DOWN", node="n1", run="llm", cause="dead")
    assert (answer["granted"], answer["rule"]) == (False, "shared-node")
    assert slurm.changes == [("n1", "DRAIN")] and "drained" in answer["why"]
    assert slurm.reads == ["n1", "n1"]
    assert ask(guard, BOB, op="QUARANTINE")["quarantined"] == []  # not taken out by her: no fault
    # With nobody else there, the same DOWN goes through both steps.
    assert ask(guard, ALICE, op="DOWN", node="n2", run="llm", cause="dead")["granted"]
    assert slurm.changes[1:] == [("n2", "DRAIN"), ("n2", "DOWN")]


def test_an_account_counts_once_per_node_whatever_run_name_it_gives(guard, clock):
    for i in range(6):
        clock.advance(1)
        assert ask(guard, ALICE, op="DRAIN", node="n1", run=f"r{i}", cause="xid")["granted"]
    (held,) = ask(guard, BOB, op="QUARANTINE")["quarantined"]
    assert [f["run"] for f in held["faults"]] == ["alice/r5"]  # the latest, alone
    assert held["until"] - held["since"] == pytest.approx(DAY)


def test_a_request_refused_by_the_cap_is_no_fault(guard, slurm):
    slurm.run(11, ALICE.uid, "n4", "n5", "n6")
    assert ask(guard, ALICE, op="DRAIN", node="n4", run="llm", cause="xid")["granted"]
    assert ask(guard, ALICE, op="DRAIN", node="n5", run="llm", cause="xid")["granted"]
    assert ask(guard, ALICE, op="DRAIN", node="n6", run="llm", cause="xid")["rule"] == "cluster-cap"
    assert [q["node"] for q in ask(guard, BOB, op="QUARANTINE")["quarantined"]] == ["n4", "n5"]


def test_an_account_holds_a_bounded_number_of_faults(guard, slurm):
    guard.memory.max_faults_per_uid = 1
    guard.limits = Limits(max_drains=10)
    with capture_logs() as logs:
        assert ask(guard, ALICE, op="DRAIN", node="n1", run="llm", cause="xid")["granted"]
        assert ask(guard, ALICE, op="DRAIN", node="n2", run="llm", cause="xid")["granted"]  # drained, not kept
        assert ask(guard, ALICE, op="DRAIN", node="n1", run="llm2", cause="xid")["granted"]  # its own key: kept
    assert [q["node"] for q in ask(guard, BOB, op="QUARANTINE")["quarantined"]] == ["n1"]
    assert [e["node"] for e in logs if e["event"] == "guard.faults_full"] == ["n2"]


def test_thousands_of_faults_on_a_node_hold_it_at_most_max_s():
    """``base_s * 2**extra`` raised OverflowError past 1,025 faults (review 2026-12-02, finding 2)."""
    settings = QuarantineSettings(faults=1, base_s=DAY, max_s=30 * DAY)
    history = [Fault("n1", 1000.0 + i, f"u{i}/r", "xid", f"{i}:n1") for i in range(1100)]
    (held,) = quarantined(history, {}, 3000.0, settings).values()
    assert held.until == 1000.0 + 1099 + 30 * DAY


def test_a_guard_db_with_thousands_of_faults_still_answers(guard, clock):
    """Faults kept under the old keys (run name in them) by a guard before this one."""
    for i in range(1100):
        guard.memory.record_fault(Fault("n1", clock.now() - 1100 + i, f"alice/r{i}", "xid", f"old:{i}"), 1001, 0.0)
    (held,) = ask(guard, BOB, op="QUARANTINE")["quarantined"]
    assert held["until"] - held["since"] == pytest.approx(30 * DAY)


def test_a_failing_request_is_answered_and_the_next_caller_served(served):  # noqa: F811
    path, slurm, _ = served
    slurm.run(7, 0, "n1")
    slurm.fail = RuntimeError("a bug in one request")
    client = GuardClient(str(path), timeout_s=5)
    answer = client.ask({"op": "DRAIN", "node": "n1", "run": "r", "cause": "c"})
    assert (answer["granted"], answer["rule"], answer["transient"]) == (False, "guard-error", True)
    slurm.fail = None
    assert client.ask({"op": "QUARANTINE"})["granted"]
    assert client.ask({"op": "DRAIN", "node": "n1", "run": "r", "cause": "c"})["granted"]
