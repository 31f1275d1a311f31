"""The guard's remedies (guard/remedy.py, guard/remedies.py): RESERVE, REBOOT, UNRESERVE and a
non-admin's RESUME, each granted only for a node the caller drained itself through the guard
(``own-remedy``), each refused for another user's node; the argv each one gives Slurm.

Slurm is a small stateful fake of the guard's NodeSlurm (jobs, node states, reservations,
reboots); the real one is in tests/slurm/test_guard_remedies_slurm.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_guard_service import (
    ADMIN,
    ALICE,
    BOB,
    guard_in,
)

from supervisor.domain.cluster import JobInfo, JobState
from supervisor.domain.health.quarantine import QuarantineSettings
from supervisor.guard.policy import Caller, Limits
from supervisor.guard.service import Guard
from supervisor.guard.slurm_node_jobs import reboot_argv, reserve_argv, unreserve_argv
from supervisor.testing.kit.clock import ManualClock
from supervisor.testing.kit.node_slurm import FakeNodeSlurm as FakeSlurm


@pytest.fixture
def slurm() -> FakeSlurm:
    s = FakeSlurm()
    s.jobs[7] = JobInfo(job_id=7, name="j", state=JobState.RUNNING, nodes=("n1", "n2"), user_id=ALICE.uid)
    s.jobs[8] = JobInfo(job_id=8, name="j", state=JobState.RUNNING, nodes=("n3",), user_id=BOB.uid)
    return s


@pytest.fixture
def guard(tmp_path: Path, slurm: FakeSlurm, clock: ManualClock) -> Guard:
    limits = Limits(frozenset({"hpc-admins"}), max_drains=4, window_s=3600, reservation_minutes=60)
    return guard_in(tmp_path, slurm, limits, QuarantineSettings(faults=1, base_s=86400), clock.now)


def ask(guard: Guard, caller: Caller, **request: str) -> dict:
    return json.loads(guard.handle_line(caller, json.dumps(request).encode()))


def drained_by_alice(guard: Guard, slurm: FakeSlurm) -> None:
    """Alice drains n1 of her job, and the job ends (the XID killed it)."""
    assert ask(guard, ALICE, op="DRAIN", node="n1", run="llm", cause="XID 79")["rule"] == "own-job"
    del slurm.jobs[7]


def quarantined(guard: Guard) -> list[str]:
    return [q["node"] for q in ask(guard, BOB, op="QUARANTINE")["quarantined"]]


def test_the_whole_remedy_of_an_own_drain_reserve_reboot_resume(guard, slurm):
    drained_by_alice(guard, slurm)
    assert quarantined(guard) == ["n1"]
    reserved = ask(guard, ALICE, op="RESERVE", node="n1", run="llm")
    assert (reserved["granted"], reserved["rule"]) == (True, "own-remedy")
    assert slurm.reservations == {"ssv-maint-n1": ("n1", "alice", 60)}
    rebooted = ask(guard, ALICE, op="REBOOT", node="n1", run="llm", cause="XID 79\x1b[2J")
    assert rebooted["granted"] and slurm.reboots == [
        ("n1", "slurm-supervisor: run alice/llm: reboot: XID 79 [2J")
    ]  # finding 12
    resumed = ask(guard, ALICE, op="RESUME", node="n1")  # validated: back to every user
    assert (resumed["granted"], resumed["rule"]) == (True, "own-remedy")
    assert slurm.reservations == {} and quarantined(guard) == []  # alice's own fault forgiven
    # the remedy is over: another RESERVE or REBOOT of the node is refused
    assert ask(guard, ALICE, op="REBOOT", node="n1", run="llm", cause="x")["rule"] == "not-own-remedy"
    assert ask(guard, ALICE, op="RESERVE", node="n1", run="llm")["rule"] == "not-own-remedy"


def test_a_remedy_of_another_users_drain_is_refused(guard, slurm):
    drained_by_alice(guard, slurm)
    for op in ("RESERVE", "REBOOT", "UNRESERVE", "RESUME"):
        answer = ask(guard, BOB, op=op, node="n1", run="bobs", cause="x")
        assert (answer["granted"], answer["rule"]) == (False, "not-own-remedy"), op
    assert ask(guard, ALICE, op="RESERVE", node="n1", run="llm")["granted"]
    for op in ("REBOOT", "UNRESERVE", "RESUME", "DRAIN"):  # alice's reservation is not bob's either
        answer = ask(guard, BOB, op=op, node="n1", run="bobs", cause="x")
        assert not answer["granted"] and answer["rule"] in ("not-own-remedy", "not-own-node"), op
    assert slurm.reboots == [] and slurm.reservations == {"ssv-maint-n1": ("n1", "alice", 60)}
    assert slurm.states == {"n1": "DRAIN"}


def test_reboot_and_resume_need_the_callers_reservation_first(guard, slurm):
    drained_by_alice(guard, slurm)
    assert ask(guard, ALICE, op="REBOOT", node="n1", run="llm", cause="x")["rule"] == "not-own-remedy"
    assert ask(guard, ALICE, op="RESUME", node="n1")["rule"] == "not-own-remedy"
    assert slurm.calls == ["DRAIN n1"]


def test_a_node_never_drained_or_held_by_another_users_job_is_not_reserved(guard, slurm):
    assert ask(guard, ALICE, op="RESERVE", node="n9", run="llm")["rule"] == "not-own-remedy"  # never drained
    drained_by_alice(guard, slurm)
    slurm.jobs[9] = JobInfo(job_id=9, name="j", state=JobState.RUNNING, nodes=("n1",), user_id=BOB.uid)
    assert ask(guard, ALICE, op="RESERVE", node="n1", run="llm")["rule"] == "shared-node"  # someone resumed it
    assert slurm.reservations == {}


def test_an_admins_resume_or_clear_ends_the_own_remedy(guard, slurm):
    drained_by_alice(guard, slurm)
    assert ask(guard, ADMIN, op="CLEAR", node="n1")["granted"]
    assert ask(guard, ALICE, op="RESERVE", node="n1", run="llm")["rule"] == "not-own-remedy"


def test_a_failed_validation_drains_the_node_again_inside_the_reservation(guard, slurm, clock):
    drained_by_alice(guard, slurm)
    assert ask(guard, ALICE, op="RESERVE", node="n1", run="llm")["granted"]
    assert ask(guard, ALICE, op="REBOOT", node="n1", run="llm", cause="XID 79")["granted"]
    clock.advance(700)  # past the follow-up rule's 10 minutes: only the reservation makes it alice's
    again = ask(guard, ALICE, op="DRAIN", node="n1", run="llm", cause="validation failed: burn-in")
    assert (again["granted"], again["rule"]) == (True, "own-remedy") and slurm.states["n1"] == "DRAIN"
    assert ask(guard, ALICE, op="UNRESERVE", node="n1")["granted"]  # needs repair: the node stays drained
    assert slurm.reservations == {} and slurm.states["n1"] == "DRAIN" and quarantined(guard) == ["n1"]


def test_remedies_are_idempotent(guard, slurm):
    drained_by_alice(guard, slurm)
    for _ in range(2):
        assert ask(guard, ALICE, op="RESERVE", node="n1", run="llm")["granted"]
    assert slurm.calls.count("reserve ssv-maint-n1") == 1
    assert ask(guard, ALICE, op="RESUME", node="n1")["granted"]  # in service already: only unreserved
    assert slurm.reservations == {}


def test_an_own_drain_older_than_a_week_gives_no_remedy(guard, slurm, clock):
    drained_by_alice(guard, slurm)
    clock.advance(7 * 86400 + 1)  # an admin returned it with a plain scontrol long ago: no longer alice's
    assert ask(guard, ALICE, op="RESERVE", node="n1", run="llm")["rule"] == "not-own-remedy"
    assert slurm.reservations == {}


def test_an_ended_reservation_gives_no_remedy(guard, slurm, clock):
    drained_by_alice(guard, slurm)
    assert ask(guard, ALICE, op="RESERVE", node="n1", run="llm")["granted"]
    clock.advance(3601)  # past reservation_minutes: Slurm ended it
    assert ask(guard, ALICE, op="REBOOT", node="n1", run="llm", cause="x")["rule"] == "not-own-remedy"


def test_an_admin_may_do_every_remedy(guard, slurm):
    assert ask(guard, ADMIN, op="RESERVE", node="n5", run="ops")["rule"] == "admin"
    assert ask(guard, ADMIN, op="REBOOT", node="n5", run="ops", cause="firmware")["rule"] == "admin"
    assert ask(guard, ADMIN, op="UNRESERVE", node="n5")["rule"] == "admin"
    assert slurm.reservations == {} and slurm.reboots == [("n5", "slurm-supervisor: run carol/ops: reboot: firmware")]


def test_malformed_remedies_are_bad_requests(guard, slurm):
    assert ask(guard, ALICE, op="REBOOT", node="n1;reboot", run="llm")["rule"] == "bad-request"
    assert ask(guard, ALICE, op="RESERVE", node="n1", run="Bad Run")["rule"] == "bad-request"
    assert slurm.calls == []


def test_the_argv_of_each_remedy():
    assert reserve_argv("ssv-maint-n1", "n1", "alice", 120) == [
        "scontrol", "create", "reservation", "ReservationName=ssv-maint-n1", "Nodes=n1", "StartTime=now",
        "Duration=120", "Users=alice", "Flags=MAINT,IGNORE_JOBS,FLEX",
    ]  # fmt: skip
    assert unreserve_argv("ssv-maint-n1") == ["scontrol", "delete", "ReservationName=ssv-maint-n1"]
    assert reboot_argv("n1", "RESUME", "slurm-supervisor: run r: reboot: a\nb  c") == [
        "scontrol", "reboot", "ASAP", "nextstate=RESUME", "reason=slurm-supervisor: run r: reboot: a b c", "n1",
    ]  # fmt: skip
