"""One local user floods the guard (issue 32, findings 3 and 4): silent connections, malformed
lines, requests that would make it read Slurm. Another user's requests are still answered, the
audit log stays small, and Slurm is read only for well-formed requests, at a bounded rate.

The flooder is ``nobody`` and the honest caller ``daemon`` (uid 1): two ordinary UIDs, neither an
admin, each a process of its own, known to the guard by SO_PEERCRED."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest
from test_guard_service import ALICE, BOB, FakeSlurm, ask
from test_guard_socket import served  # noqa: F401 - a fixture

from supervisor.adapters.guard_client import GuardClient
from supervisor.domain.health.quarantine import QuarantineSettings
from supervisor.guard.audit import AuditLog
from supervisor.guard.memory import GuardMemory
from supervisor.guard.policy import Limits
from supervisor.guard.service import Guard
from supervisor.guard.slots import SlotLimits, Slots
from supervisor.testing.slurm.privileges import NOBODY
from supervisor.testing.slurm.runas import python_as

DAEMON_UID = 1
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="callers of other UIDs need root")

# Opens connections as fast as it can and never writes, for ``seconds``; keeps each one open.
SILENT_FLOOD = """
import socket, sys, time
held, end = [], time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(sys.argv[1])
    except OSError:
        s.close(); time.sleep(0.005); continue
    held.append(s)
    if len(held) > 400:
        held.pop(0).close()
    time.sleep(0.002)
"""
# Asks QUARANTINE ``count`` times; prints one word per answer: ok, or what went wrong.
HONEST = """
import json, socket, sys, time
for _ in range(int(sys.argv[2])):
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(3)
            s.connect(sys.argv[1])
            s.sendall(b'{"op": "QUARANTINE"}\\n')
            line = s.makefile("rb").readline()
        print("ok" if json.loads(line).get("granted") else "refused", flush=True)
    except (OSError, ValueError):
        print("none", flush=True)
    time.sleep(0.1)
"""


@needs_root
def test_silent_connections_of_one_user_do_not_lock_another_out(served):  # noqa: F811
    path, _, _ = served
    flood = python_as(NOBODY, SILENT_FLOOD, str(path), "4")
    time.sleep(1.0)  # the flood holds whatever it can get
    honest = python_as(DAEMON_UID, HONEST, str(path), "15")
    answers = honest.communicate(timeout=60)[0].split()
    flood.wait(30)
    assert answers == ["ok"] * 15


def test_slots_per_uid_and_the_slots_kept_for_the_trusted():
    slots = Slots(SlotLimits(total=6, per_uid=2, kept=2))
    assert [slots.take(1001, trusted=False) for _ in range(3)] == [True, True, False]  # 2 per UID
    assert slots.take(1002, trusted=False) and slots.take(1002, trusted=False)
    assert not slots.take(1003, trusted=False)  # the last 2 are kept
    assert slots.take(1004, trusted=True) and slots.take(0, trusted=True)
    assert not slots.take(0, trusted=True)  # all 6 in use
    slots.give(1001)
    assert slots.take(0, trusted=True) and slots.in_use() == 6


@pytest.fixture
def guard(tmp_path: Path) -> Guard:
    slurm = FakeSlurm()
    slurm.run(7, ALICE.uid, "n1")
    return Guard(
        slurm=slurm,
        memory=GuardMemory(tmp_path / "state"),
        audit=AuditLog(tmp_path / "audit.jsonl"),
        limits=Limits(max_drains=8),
        quarantine=QuarantineSettings(faults=1),
        clock=lambda: 1_000_000.0,
    )


def test_malformed_lines_never_read_slurm_and_fold_into_one_audit_line(guard, tmp_path):
    for line in (
        b"not json",
        b'{"op": "DRAIN", "node": "n1", "run": "BAD RUN"}',
        b'{"op": "DOWN", "node": "$(x)"}',
    ) * 200:
        assert json.loads(guard.handle_line(BOB, line))["rule"] == "bad-request"
    assert guard.slurm.reads == []
    guard.audit.close()
    lines = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(x["rule"], x.get("repeats")) for x in lines] == [("bad-request", None), ("bad-request", 599)]


def test_requests_that_read_slurm_are_rate_limited_per_uid(guard):
    answers = [ask(guard, BOB, op="DRAIN", node="n1", run="r", cause="c")["rule"] for _ in range(100)]
    assert answers.count("not-own-node") == guard.rate.burst and set(answers) == {"not-own-node", "rate-limited"}
    assert len(guard.slurm.reads) == guard.rate.burst
    limited = ask(guard, BOB, op="DRAIN", node="n1", run="r", cause="c")
    assert limited["transient"] is True and limited["frees_at"] > 1_000_000.0
    assert ask(guard, ALICE, op="DRAIN", node="n1", run="r", cause="c")["granted"]  # another UID is not


def test_the_audit_log_is_rotated_past_its_size(tmp_path):
    log = AuditLog(tmp_path / "audit.jsonl", max_bytes=2000, keep=2)
    for i in range(100):
        log.record({"granted": True, "uid": 1, "rule": "own-job", "at": float(i), "why": "x" * 100})
    log.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]
    assert all((tmp_path / n).stat().st_size <= 2000 + 200 for n in names)


def test_quarantine_reads_do_not_wait_for_a_decision(guard):
    """A decision waits on Slurm (up to its command timeout); every instance's tick reads the
    quarantine meanwhile."""
    entered, release = threading.Event(), threading.Event()
    slow = guard.slurm.jobs_on

    def stuck(node: str):
        entered.set()
        release.wait(10)
        return slow(node)

    guard.slurm.jobs_on = stuck  # type: ignore[method-assign]
    drain = threading.Thread(
        target=ask, args=(guard, ALICE), kwargs={"op": "DRAIN", "node": "n1", "run": "r", "cause": "c"}
    )
    drain.start()
    assert entered.wait(5)
    started = time.monotonic()
    assert ask(guard, BOB, op="QUARANTINE")["granted"]
    assert time.monotonic() - started < 0.5
    release.set()
    drain.join(5)


def test_the_client_waits_its_turn_in_a_full_accept_queue(tmp_path):
    """A Unix socket's connect to a full queue fails at once when the socket has a Python timeout
    (non-blocking: EAGAIN): one user's connect flood then failed every instance's request
    (bench/guard_abuse.py). The client waits in the kernel's queue instead, up to its timeout."""
    path = tmp_path / "g.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        listener.listen(0)
        filler = socket.socket(socket.AF_UNIX)
        filler.connect(str(path))  # the queue is full now
        answers: list[dict] = []
        asking = threading.Thread(
            target=lambda: answers.append(GuardClient(str(path), timeout_s=5).ask({"op": "QUARANTINE"}))
        )
        asking.start()
        time.sleep(0.5)
        assert asking.is_alive() and not answers  # waiting, not failed
        listener.accept()[0].close()
        filler.close()
        conn, _ = listener.accept()
        with conn:
            conn.makefile("rb").readline()
            conn.sendall(b'{"granted": true}\n')
        asking.join(5)
    assert answers == [{"granted": True}]
