"""Another local user cannot lock an instance's own account out of its API (issue 32, finding 6:
16 connections asking ``whoami`` every 8 s held every slot for good).

The stranger is ``nobody`` (a process of its own, known by SO_PEERCRED); the instance's account is
this test's (the API is served in this process, as the daemon serves it)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.adapters.sqlite import SqliteStore
from supervisor.api.access import Caller, Group, Instance
from supervisor.api.client import ApiClient, ApiFailure
from supervisor.api.identity import peer
from supervisor.api.ops import Operations
from supervisor.api.server import IDLE_GAP_S
from supervisor.api.testing import local_api, single_user_store
from supervisor.domain.records import Event
from supervisor.testing.kit.clock import ManualClock
from supervisor.testing.slurm.privileges import NOBODY
from supervisor.testing.slurm.runas import python_as
from supervisor.testing.slurm.users import python_for_others

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a caller of another UID needs root")

# Keeps ``count`` connections, each asking whoami every 0.5 s; reopens one the daemon closes. Says
# "holding" once it has opened them all, so the test waits on that, not on the clock.
HOLDER = """
import socket, sys, time
path, count, end = sys.argv[1], int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
def opened():
    s = socket.socket(socket.AF_UNIX); s.settimeout(2)
    try:
        s.connect(path)
    except OSError:
        pass
    return s
held = [opened() for _ in range(count)]
print("holding", flush=True)
while time.monotonic() < end:
    for i, s in enumerate(held):
        try:
            s.sendall(b'{"op":"whoami"}\\n')
            if b"busy" in s.recv(65536) or False:
                raise OSError
        except OSError:
            s.close(); held[i] = opened()
    time.sleep(0.5)
"""


@pytest.fixture
def open_folder() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="ssv-api-"))
    folder.chmod(0o755)  # nobody reaches the socket in it
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@needs_root
def test_a_stranger_holding_connections_does_not_lock_the_account_out(tmp_path, open_folder):
    with local_api(tmp_path / "state", socket=open_folder / "api.sock") as server:
        holder = python_as(NOBODY, HOLDER, str(server.path), "24", "5")
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline() == "holding\n"  # the stranger holds what it can get
            answers = []
            for _ in range(10):
                try:
                    answers.append(ApiClient(server.path, timeout_s=5).call("runs"))
                except ApiFailure as exc:
                    answers.append(exc.kind)
                time.sleep(0.1)
        finally:
            holder.wait(30)
    assert answers == [[]] * 10


def test_a_connection_idle_after_its_answer_is_closed(tmp_path, open_folder):
    with (
        local_api(tmp_path / "state", socket=open_folder / "api.sock") as server,
        socket.socket(socket.AF_UNIX) as held,
    ):
        held.settimeout(10)
        held.connect(str(server.path))
        held.sendall(b'{"op":"whoami"}\n')
        assert held.recv(65536).endswith(b"\n")
        started = time.monotonic()
        assert held.recv(10) == b""  # closed: it asked nothing more
        assert time.monotonic() - started < IDLE_GAP_S + 1.0


CONNECT = """
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
time.sleep(2)
"""


@needs_root
def test_groups_come_from_the_group_database_not_from_the_peer_process(open_folder):
    """A process's own supplementary groups are its own (a setgid program's, a group removed from
    its account after it started): review 2026-12-02, finding 15. Here nobody's process holds
    root's group, which the group database does not give nobody."""
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(open_folder / "peer.sock"))
        os.chmod(open_folder / "peer.sock", 0o666)  # noqa: S103 - nobody connects
        server.listen(1)
        python, env = python_for_others()
        argv = [*python, "-I", "-c", CONNECT, str(open_folder / "peer.sock")]
        client = subprocess.Popen(argv, env=env, user=NOBODY, group=NOBODY, extra_groups=[0])
        try:
            server.settimeout(10)
            conn, _ = server.accept()
            with conn:
                caller = peer(conn)
        finally:
            client.wait(10)
    assert caller.uid == NOBODY and 0 not in caller.gids
    assert caller.gids == frozenset(os.getgrouplist("nobody", NOBODY))


class CountingStore(SqliteStore):
    """The real store, counting its whole-logbook reads."""

    whole_reads = 0

    def events(self, run: str | None = None) -> list[Event]:
        self.whole_reads += run is None
        return super().events(run)


def test_a_caller_who_may_read_no_run_costs_no_logbook_read(tmp_path):
    """``events`` without a run loaded every event of every run before filtering to the caller's
    runs, none for a stranger: ~1 s of the daemon's CPU per request (review 2026-12-02, finding 11)."""
    single_user_store(tmp_path, state="running")
    store = CountingStore(tmp_path)
    ops = Operations(store, ManualClock(), Instance(uid=2000, name="team-a", group=Group(3000, "team-a")), None)
    stranger, account = Caller(2009, "mallory", frozenset({2009})), Caller(2000, "team-a", frozenset({3000}))
    assert json.loads(ops.answer(stranger, b'{"op":"events"}')) == {"ok": True, "data": []}
    assert store.whole_reads == 0
    assert json.loads(ops.answer(account, b'{"op":"events"}'))["ok"] and store.whole_reads == 1
