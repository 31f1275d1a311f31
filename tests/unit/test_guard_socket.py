"""The guard over its real Unix socket: callers known by SO_PEERCRED (not by what they write),
bounded lines and deadlines, socket activation (LISTEN_FDS), and the client's error mapping."""

from __future__ import annotations

import grp
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from test_guard_service import FakeSlurm, guard_in

from supervisor.adapters.guard_client import GuardClient, GuardRefused, check
from supervisor.domain.cluster import NodeChange
from supervisor.domain.health.quarantine import QuarantineSettings
from supervisor.guard.policy import Limits
from supervisor.guard.server import GuardServer, bound_socket, passed_socket
from supervisor.ports import CapReached, PermanentError, PermissionDenied, TransientError
from supervisor.testing.slurm import privileges
from supervisor.testing.slurm.privileges import NOBODY
from supervisor.testing.slurm.users import python_for_others

CLIENT = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode() + b"\\n")
print(s.makefile("rb").readline().decode(), end="")
"""


@pytest.fixture
def served(tmp_path: Path):
    """A guard on a socket in tmp_path, served from a thread; yields (path, slurm, audit path)."""
    slurm = FakeSlurm()
    guard = guard_in(tmp_path, slurm, Limits(max_drains=4), QuarantineSettings(faults=1))
    public = Path(tempfile.mkdtemp(prefix="ssv-guard-", dir="/tmp"))  # not under pytest's 0700 folders
    public.chmod(0o755)
    path = public / "guard.sock"
    server = GuardServer(bound_socket(path), guard, timeout_s=0.5)
    stop = threading.Event()
    thread = threading.Thread(target=server.serve, args=(stop,), daemon=True)
    thread.start()
    yield path, slurm, tmp_path / "audit.jsonl"
    stop.set()
    thread.join(5)
    server.sock.close()
    shutil.rmtree(public, ignore_errors=True)


def audit(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def as_nobody(path: Path, request: dict) -> dict:
    python, env = python_for_others()
    done = subprocess.run(
        [*python, "-I", "-c", CLIENT, str(path), json.dumps(request)],
        env=env,
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    return json.loads(done.stdout)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")


def test_the_socket_is_open_to_all_and_root_is_an_admin(served):
    path, slurm, audit_path = served
    assert path.stat().st_mode & 0o777 == 0o666
    answer = GuardClient(str(path)).ask({"op": "DRAIN", "node": "n9", "run": "r", "cause": "c"})
    assert answer["granted"] == (os.geteuid() == 0)
    assert audit(audit_path)[-1]["uid"] == os.geteuid() and audit(audit_path)[-1]["pid"] == os.getpid()


@needs_root
def test_the_caller_is_who_the_kernel_says_not_who_the_request_claims(served):
    path, slurm, audit_path = served
    claim = {"op": "DRAIN", "node": "n1", "run": "r", "cause": "c", "user": "root", "uid": 0}
    assert as_nobody(path, claim)["rule"] == "not-own-node"
    slurm.run(7, NOBODY, "n1")  # now nobody does run a job on n1
    assert as_nobody(path, claim)["rule"] == "own-job"
    assert as_nobody(path, {"op": "RESUME", "node": "n1"})["rule"] == "not-own-remedy"  # not in its reservation
    assert [(a["uid"], a["user"], a["rule"]) for a in audit(audit_path)] == [
        (NOBODY, "nobody", "not-own-node"),
        (NOBODY, "nobody", "own-job"),
        (NOBODY, "nobody", "not-own-remedy"),
    ]
    assert slurm.reasons["n1"] == ("DRAIN", "slurm-supervisor: run nobody/r: c")  # the kernel names the account


def test_a_silent_caller_holds_nobody_up_and_an_overlong_line_is_refused(served):
    path, slurm, audit_path = served
    with socket.socket(socket.AF_UNIX) as silent:
        silent.connect(str(path))
        started = time.monotonic()
        assert GuardClient(str(path), timeout_s=5).ask({"op": "QUARANTINE"})["granted"]
        assert time.monotonic() - started < 0.4  # served while the silent caller still waits
        silent.settimeout(5)
        assert silent.recv(10) == b""  # closed at the deadline, without an answer
    with socket.socket(socket.AF_UNIX) as flood:
        flood.connect(str(path))
        flood.settimeout(5)
        flood.sendall(b'{"op": "DRAIN", "cause": "' + b"x" * 20000)
        answer = json.loads(flood.makefile("rb").readline())
    assert answer["rule"] == "bad-request"
    assert [a["rule"] for a in audit(audit_path)] == ["bad-request"]


def test_bound_socket_replaces_a_stale_socket_but_nothing_else(tmp_path):
    path = tmp_path / "g.sock"
    bound_socket(path).close()  # left behind, as after a crash
    bound_socket(path).close()
    other = tmp_path / "file"
    other.write_text("precious")
    with pytest.raises(OSError, match="not a socket"):
        bound_socket(other)
    assert other.read_text() == "precious"


def test_no_passed_socket_unless_it_is_for_this_process():
    assert passed_socket({}) is None
    assert passed_socket({"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "1"}) is None
    assert passed_socket({"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "0"}) is None


def test_socket_activation_serves_on_the_socket_systemd_passes(tmp_path):
    activate = shutil.which("systemd-socket-activate")
    if activate is None:
        if os.environ.get("CI") == "true":
            pytest.fail("systemd-socket-activate is missing on CI; install the systemd package")
        pytest.skip("systemd-socket-activate is not installed")
    config = tmp_path / "guard.toml"
    not_bound = tmp_path / "never.sock"
    config.write_text(f'[guard]\nstate_dir = "{tmp_path / "state"}"\nsocket = "{not_bound}"\n')
    path = tmp_path / "activated.sock"
    argv = [activate, "-l", str(path), sys.executable, "-m", "supervisor", "guard", "serve", "--config", str(config)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            answer = GuardClient(str(path), timeout_s=20).ask({"op": "QUARANTINE"})
        except TransientError as exc:
            proc.terminate()
            pytest.fail(f"{exc}; the guard said:\n{proc.communicate(timeout=10)[0].decode()}")
        assert answer["granted"] and answer["quarantined"] == []
        assert not not_bound.exists()  # it used the passed socket, it did not bind its own
        assert (tmp_path / "state" / "audit.jsonl").exists()
    finally:
        proc.terminate()
        out = proc.communicate(timeout=10)[0].decode()
    assert proc.returncode in (0, -15), out


# ----------------------------------------------------------------------------- the client's errors


def test_check_maps_answers_onto_port_errors():
    assert check({"granted": True, "rule": "own-job"})["rule"] == "own-job"
    with pytest.raises(CapReached) as capped:
        check({"granted": False, "rule": "cluster-cap", "why": "full", "frees_at": 123.0})
    assert capped.value.frees_at == 123.0
    with pytest.raises(TransientError):
        check({"granted": False, "rule": "slurm-error", "transient": True})
    with pytest.raises(GuardRefused) as refused:
        check({"granted": False, "rule": "not-own-node", "why": "n1 is not yours"})
    assert refused.value.rule == "not-own-node" and "n1 is not yours" in str(refused.value)
    assert not isinstance(refused.value, PermissionDenied)  # the daemon keeps asking for other nodes


def test_no_guard_at_the_path_is_permanent_and_a_silent_one_transient(tmp_path):
    with pytest.raises(PermanentError, match="no node guard"):
        GuardClient(str(tmp_path / "missing.sock")).set_node_state("n1", NodeChange.DRAIN, "r", "x")
    unbound = tmp_path / "dead.sock"
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(unbound))  # bound, never listening: connection refused
        with pytest.raises(TransientError):
            GuardClient(str(unbound)).quarantined()
    mute = tmp_path / "mute.sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(mute))
        server.listen(1)
        started = time.monotonic()
        with pytest.raises(TransientError, match="did not answer"):
            GuardClient(str(mute), timeout_s=0.3).quarantined()
        assert time.monotonic() - started < 2


def test_the_port_sends_the_cause_without_the_daemons_prefix(tmp_path):
    seen: list[dict] = []

    def transport(request):
        seen.append(dict(request))
        return {"granted": True, "rule": "own-job", "quarantined": []}

    client = GuardClient(transport=transport)
    client.set_node_state("n1", NodeChange.DOWN, "llm", "slurm-supervisor: run llm: XID 79")
    assert seen == [{"op": "DOWN", "node": "n1", "run": "llm", "cause": "XID 79"}]
    assert client.quarantined() == {}


@needs_root
def test_a_socket_for_one_group_lets_only_its_members_connect(tmp_path):
    """Least privilege (issue 32): with ``[guard] socket_group`` (the shipped socket unit's
    ``SocketGroup=slurm-supervisor-guard``) only members may connect at all, so an account that
    runs no instance cannot take the guard's slots; who a member is, is still SO_PEERCRED's word."""
    public = Path(tempfile.mkdtemp(prefix="ssv-guard-", dir="/tmp"))
    public.chmod(0o755)
    try:
        others = public / "root-only.sock"
        with bound_socket(others, group="root"):
            assert (others.stat().st_mode & 0o777, others.stat().st_gid) == (0o660, 0)
            with pytest.raises(subprocess.CalledProcessError, match="returned non-zero") as refused:
                as_nobody(others, {"op": "QUARANTINE"})
            assert "PermissionError" in str(refused.value.stderr)
        members = public / "nobodys-group.sock"
        with bound_socket(members, group=grp.getgrgid(NOBODY).gr_name) as sock:
            guard = guard_in(tmp_path, FakeSlurm(), Limits(max_drains=4), QuarantineSettings(faults=1))
            server = GuardServer(sock, guard, timeout_s=0.5)
            stop = threading.Event()
            thread = threading.Thread(target=server.serve, args=(stop,), daemon=True)
            thread.start()
            try:
                assert as_nobody(members, {"op": "QUARANTINE"})["granted"]
            finally:
                stop.set()
                thread.join(5)
        with pytest.raises(OSError, match="no group 'no-such-group-ssv'"):
            bound_socket(public / "x.sock", group="no-such-group-ssv")
    finally:
        shutil.rmtree(public, ignore_errors=True)


@needs_root
def test_an_account_outside_the_guards_group_is_told_so_not_retried_for_ever():
    """A connect the socket's mode refuses is a PermanentError naming the group (before: an
    OSError like any other, a TransientError retried every tick)."""
    public = Path(tempfile.mkdtemp(prefix="ssv-guard-", dir="/tmp"))
    public.chmod(0o755)
    try:
        path = public / "guard.sock"
        with bound_socket(path, group="root"), privileges.as_nobody():
            with pytest.raises(PermanentError, match="slurm-supervisor-guard") as refused:
                GuardClient(str(path), timeout_s=2.0).quarantined()
            assert not isinstance(refused.value, TransientError)
    finally:
        shutil.rmtree(public, ignore_errors=True)
