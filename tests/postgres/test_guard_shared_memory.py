"""Guards on two login nodes sharing one memory in a real PostgreSQL (issue 33, item 3): the
cluster-wide cap holds exactly across both under concurrent requests of two accounts, a fault one
guard recorded quarantines the node in the other's answer, a drain made through one is the caller's
own at the other, and a database that does not answer refuses as transient, granting nothing.

Slurm is the stateful fake of the guard's NodeSlurm (supervisor.testing.kit.node_slurm), slowed so
that a decision's reads and its write are far apart: where two guards could race, they would. With
each guard's own memory (SQLite, as before this) the same requests got twice the cap."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from supervisor.domain.health.quarantine import QuarantineSettings
from supervisor.guard.audit import AuditLog
from supervisor.guard.memory import Memory
from supervisor.guard.memory_pg import SharedGuardMemory
from supervisor.guard.policy import Caller, Limits
from supervisor.guard.service import Guard
from supervisor.testing.kit.node_slurm import FakeNodeSlurm

pytestmark = pytest.mark.postgres

ALICE = Caller(1001, 1001, 11, "alice", frozenset({"alice"}))
BOB = Caller(1002, 1002, 12, "bob", frozenset({"bob"}))
CAP = 3


def guard_on(memory: Memory, slurm: FakeNodeSlurm, audit: Path) -> Guard:
    return Guard(
        slurm=slurm,
        memory=memory,
        audit=AuditLog(audit),
        limits=Limits(max_drains=CAP, window_s=3600),
        quarantine=QuarantineSettings(faults=1, base_s=86400),
    )


@pytest.fixture
def cluster() -> FakeNodeSlurm:
    slurm = FakeNodeSlurm(read_delay_s=0.02)
    slurm.run(7, ALICE.uid, *(f"a{i}" for i in range(4)))
    slurm.run(8, BOB.uid, *(f"b{i}" for i in range(4)))
    return slurm


@pytest.fixture
def two_guards(postgres, cluster, tmp_path):
    memories = [SharedGuardMemory(postgres.url, postgres.password) for _ in range(2)]
    guards = [guard_on(m, cluster, tmp_path / f"audit-{i}.jsonl") for i, m in enumerate(memories)]
    yield guards
    for m in memories:
        m.close()


def ask(guard: Guard, caller: Caller, **request: str) -> dict:
    return json.loads(guard.handle_line(caller, json.dumps(request).encode()))


def test_two_guards_grant_exactly_the_cluster_wide_cap_between_them(two_guards, cluster):
    """Eight drains at once, from two accounts, half through each login node's guard."""
    asks = [(two_guards[i % 2], caller, f"{caller.name[0]}{i}") for caller in (ALICE, BOB) for i in range(4)]
    answers: list[dict] = []
    start = threading.Barrier(len(asks))

    def one(guard: Guard, caller: Caller, node: str) -> None:
        start.wait()
        answers.append(ask(guard, caller, op="DRAIN", node=node, run="llm", cause="XID 79"))

    threads = [threading.Thread(target=one, args=a) for a in asks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    granted = [a for a in answers if a["granted"]]
    assert len(answers) == len(asks) and len(granted) == CAP, answers
    assert {a["rule"] for a in answers if not a["granted"]} == {"cluster-cap"}
    assert sum(c.startswith("DRAIN") for c in cluster.calls) == CAP, cluster.calls


def test_a_fault_recorded_by_one_guard_is_in_the_others_quarantine(two_guards):
    first, second = two_guards
    assert ask(first, ALICE, op="DRAIN", node="a1", run="llm", cause="XID 79")["granted"]
    held = json.loads(second.handle_line(BOB, b'{"op": "QUARANTINE"}'))["quarantined"]
    assert [q["node"] for q in held] == ["a1"]


def test_a_drain_made_through_one_guard_is_the_callers_own_at_the_other(two_guards, cluster):
    first, second = two_guards
    assert ask(first, ALICE, op="DRAIN", node="a2", run="llm", cause="XID 79")["granted"]
    cluster.jobs.pop(7)  # the job ended: the node is idle and drained, Alice's to remedy
    assert ask(second, ALICE, op="RESERVE", node="a2", run="llm")["granted"]
    refused = ask(first, BOB, op="RESERVE", node="a2", run="llm")
    assert (refused["granted"], refused["rule"]) == (False, "not-own-remedy")
    assert ask(first, ALICE, op="RESUME", node="a2", run="llm")["granted"]  # the reservation made through the other


def test_a_memory_that_does_not_answer_refuses_as_transient_and_grants_nothing(postgres, cluster, tmp_path):
    url = postgres.new()
    memory = SharedGuardMemory(url, postgres.password, connect_timeout_s=2)
    guard = guard_on(memory, cluster, tmp_path / "audit.jsonl")
    try:
        assert ask(guard, ALICE, op="DRAIN", node="a0", run="llm", cause="XID 79")["granted"]
        before = list(cluster.calls)
        postgres.server.drop(url)  # its connections cut, the database gone
        answer = ask(guard, ALICE, op="DRAIN", node="a3", run="llm", cause="XID 79")
        assert (answer["granted"], answer["rule"], answer["transient"]) == (False, "memory-unreachable", True)
        assert cluster.calls == before
        quarantine = json.loads(guard.handle_line(BOB, b'{"op": "QUARANTINE"}'))
        assert [q["node"] for q in quarantine.get("quarantined", [])] in ([], ["a0"])  # the last answer, if any
    finally:
        memory.close()
