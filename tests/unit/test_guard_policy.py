"""The guard's pure decision: who may DOWN/DRAIN which node, the cluster-wide cap, the reason template."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.domain.cluster import JobInfo, JobState
from supervisor.guard.policy import (
    FOLLOW_UP_S,
    MAX_REASON,
    Caller,
    Facts,
    Grant,
    Limits,
    Request,
    clean_cause,
    decide,
    slurm_reason,
)

ALICE = Caller(uid=1001, gid=1001, pid=42, name="alice", groups=frozenset({"alice", "team-a"}))
BOB = Caller(uid=1002, gid=1002, pid=43, name="bob", groups=frozenset({"bob"}))
ADMIN = Caller(uid=1003, gid=1003, pid=44, name="carol", groups=frozenset({"carol", "hpc-admins"}))
LIMITS = Limits(admin_groups=frozenset({"hpc-admins"}), max_drains=2, window_s=3600.0)
NOW = 10_000.0


def job(job_id: int, uid: int | None, nodes: tuple[str, ...], state: JobState = JobState.RUNNING) -> JobInfo:
    return JobInfo(job_id=job_id, name="j", state=state, nodes=nodes, user_id=uid)


ALICES_JOB = job(7, ALICE.uid, ("n1", "n2"))


def drain(node: str = "n1", run: str = "llm", cause: str = "XID 79", op: str = "DRAIN") -> Request:
    return Request(op=op, node=node, run=run, cause=cause)


def test_a_node_of_the_callers_running_job_is_granted_with_the_templated_reason() -> None:
    v = decide(ALICE, drain(), Facts(NOW, (ALICES_JOB,)), LIMITS)
    assert (v.granted, v.rule, v.job, v.job_nodes, v.fault) == (True, "own-job", 7, ("n1", "n2"), True)
    assert v.reason == "slurm-supervisor: run alice/llm: XID 79"


@pytest.mark.parametrize(
    "jobs, why",
    [
        ((job(8, BOB.uid, ("n1",)),), "another user's job"),
        ((), "an idle node"),
        ((job(7, ALICE.uid, ("n1",), JobState.PENDING),), "a pending job of the caller"),
        ((job(7, ALICE.uid, ("n1",), JobState.COMPLETING),), "a completing job of the caller"),
        ((job(7, ALICE.uid, ("n2",)),), "the caller's job on another node"),
    ],
)
def test_other_nodes_are_refused(jobs: tuple[JobInfo, ...], why: str) -> None:
    v = decide(ALICE, drain("n1"), Facts(NOW, jobs), LIMITS)
    assert (v.granted, v.rule, v.fault, v.reason) == (False, "not-own-node", False, ""), why
    assert "alice" in v.why and "n1" in v.why


def test_a_job_without_a_known_owner_is_nobodys() -> None:
    v = decide(ALICE, drain(), Facts(NOW, (job(7, None, ("n1",)),)), LIMITS)
    assert v.rule == "not-own-node"


def test_admins_may_drain_any_node_and_root_is_an_admin() -> None:
    root = Caller(0, 0, 1, "root", frozenset({"root"}))
    for caller in (ADMIN, root):
        v = decide(caller, drain("n4"), Facts(NOW), LIMITS)
        assert (v.granted, v.rule) == (True, "admin")


def test_the_nodes_of_a_job_the_guard_just_changed_follow_up_for_a_while() -> None:
    """A DOWN ends or requeues the job at once: the DRAIN that follows, and the job's other faulty
    nodes, are no longer in a running job. They were when the guard checked; they still count."""
    downed = Grant("n1", ALICE.uid, "DOWN", NOW - 5, job=7, job_nodes=("n1", "n2"))
    for op, node in (("DRAIN", "n1"), ("DOWN", "n2"), ("DRAIN", "n2")):
        v = decide(ALICE, drain(node, op=op), Facts(NOW, (), (downed,)), LIMITS)
        assert (v.granted, v.rule, v.job) == (True, "follow-up", 7), (op, node)
    assert decide(ALICE, drain("n3"), Facts(NOW, (), (downed,)), LIMITS).rule == "not-own-node"
    assert decide(BOB, drain("n2"), Facts(NOW, (), (downed,)), LIMITS).rule == "not-own-node"
    late = Facts(NOW + FOLLOW_UP_S + 10, (), (downed,))
    assert decide(ALICE, drain("n2"), late, LIMITS).rule == "not-own-node"
    # Once another user's job runs there, it is shared: a DOWN would kill that job too.
    taken = Facts(NOW, (job(9, BOB.uid, ("n2",)),), (downed,))
    assert decide(ALICE, drain("n2"), taken, LIMITS).rule == "shared-node"


def test_the_cap_counts_distinct_nodes_of_every_caller_in_the_window() -> None:
    grants = (
        Grant("n5", BOB.uid, "DOWN", NOW - 100),
        Grant("n5", BOB.uid, "DRAIN", NOW - 99),
        Grant("n6", ALICE.uid, "DRAIN", NOW - 50),
        Grant("n9", ALICE.uid, "DRAIN", NOW - 4000),  # outside the window
    )
    facts = Facts(NOW, (ALICES_JOB,), grants)
    v = decide(ALICE, drain("n1"), facts, LIMITS)
    assert (v.granted, v.rule, v.fault, v.job) == (False, "cluster-cap", False, 7)  # refused: no fault
    assert v.frees_at == NOW - 99 + 3600
    # A node already counted adds nothing: its follow-up still passes the cap.
    again = decide(ALICE, drain("n6"), Facts(NOW, (job(9, ALICE.uid, ("n6",)),), grants), LIMITS)
    assert again.granted


def test_the_cap_binds_admins_too_and_zero_means_never() -> None:
    grants = (Grant("n5", BOB.uid, "DRAIN", NOW - 1), Grant("n6", BOB.uid, "DRAIN", NOW - 1))
    assert decide(ADMIN, drain("n1"), Facts(NOW, (), grants), LIMITS).rule == "cluster-cap"
    assert decide(ALICE, drain(), Facts(NOW, (ALICES_JOB,)), Limits(max_drains=0)).rule == "cluster-cap"


@pytest.mark.parametrize("op", ["RESUME", "CLEAR"])
def test_resume_and_clear_are_for_admins_only(op: str) -> None:
    req = Request(op=op, node="n1")
    assert decide(ADMIN, req, Facts(NOW), LIMITS).rule == "admin"
    v = decide(ALICE, req, Facts(NOW, (ALICES_JOB,)), LIMITS)
    assert (v.granted, v.rule) == (False, "admin-only")


@pytest.mark.parametrize(
    "req",
    [
        Request(op="REBOOT", node="n1"),
        Request(op="DRAIN", node="n1 state=resume", run="llm"),
        Request(op="DRAIN", node="", run="llm"),
        Request(op="DRAIN", node="n1", run="LLM"),
        Request(op="DRAIN", node="n1", run="llm: pwned"),
        Request(op="DRAIN", node="n1", run=""),
        Request(op="DRAIN", node="n1", run="llm", cause="x" * 5000),
        Request(op="RESUME", node="n1\nn2"),
    ],
)
def test_malformed_requests_are_refused_before_anything_else(req: Request) -> None:
    v = decide(ADMIN, req, Facts(NOW, (ALICES_JOB,)), LIMITS)
    assert (v.granted, v.rule) == (False, "bad-request")


def test_a_forged_cause_cannot_leave_the_template() -> None:
    cause = "ok\nreason=pwned state=resume\r\x1b]0;owned\x07\x1b[2J\x00 tab\there \u00e9\u202e" + "A" * 900
    reason = slurm_reason("alice", "llm", cause)
    assert reason.startswith("slurm-supervisor: run alice/llm: ok reason=pwned state=resume ")
    assert len(reason) == MAX_REASON
    assert all(" " <= c <= "~" for c in reason)
    assert "  " not in reason


@given(st.text(max_size=3000))
def test_any_cause_gives_a_printable_bounded_reason_under_the_prefix(cause: str) -> None:
    reason = slurm_reason("alice", "run-1", cause)
    assert reason.startswith("slurm-supervisor: run alice/run-1: ")
    assert len(reason) <= MAX_REASON and all(" " <= c <= "~" for c in reason)
    assert reason == reason.strip() or len(reason) == MAX_REASON


def test_an_empty_cause_still_says_something() -> None:
    assert clean_cause("\n\t\x00") == "no cause given"
