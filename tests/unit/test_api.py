"""The instance's local API (issue 13 item 3; review findings #12): the kernel names the caller,
the rules decide who may act on which run, and every human action is signed with the caller's
passwd name, never ``$USER``/``$LOGNAME``. Requests are typed and bounded.

The rules are pure and tested with plain values; the socket, with callers that really are other
accounts (root only: ``supervisor.testing.slurm.users`` makes them; skipped elsewhere, failed under CI)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

from supervisor.adapters.sqlite import SqliteStore
from supervisor.api import wire
from supervisor.api.access import Caller, Decision, Group, Instance, may_act_on_instance, may_act_on_run, may_submit
from supervisor.api.client import ApiClient, ApiFailure
from supervisor.api.server import ApiServer, SocketInUse
from supervisor.api.testing import local_api, single_user_store
from supervisor.testing.kit.clock import ManualClock

TEAM = Instance(uid=2000, name="team-a", group=Group(3000, "team-a"), admins=Group(3100, "ops"))
ALICE = Caller(2001, "alice", frozenset({2001, 3000}))  # in the team's group
OWNER = Caller(2002, "olga", frozenset({2002}))  # owns a run; not (or no longer) in the group
ADMIN = Caller(2003, "adam", frozenset({2003, 3100}))
MALLORY = Caller(2009, "mallory", frozenset({2009, 100}))
ACCOUNT = Caller(2000, "team-a", frozenset({3000}))
ROOT = Caller(0, "root", frozenset({0}))


# --------------------------------------------------------------------------- the rules


@pytest.mark.parametrize(
    ("caller", "rule"),
    [
        (OWNER, "the run's owner"),
        (ALICE, "a member of the instance's group team-a"),
        (ADMIN, "a member of the admin group ops"),
        (ACCOUNT, "the instance's account team-a"),
        (ROOT, "root"),
    ],
)
def test_owner_group_admins_account_and_root_may_act_on_a_run(caller: Caller, rule: str) -> None:
    assert may_act_on_run(caller, TEAM, "llm", (OWNER.uid, OWNER.name), "cancel") == Decision(True, rule)


def test_anyone_else_is_refused_with_the_rule_named() -> None:
    decision = may_act_on_run(MALLORY, TEAM, "llm", (OWNER.uid, OWNER.name), "cancel")
    assert not decision.allowed
    assert decision.rule == (
        "mallory (uid 2009) may not cancel run 'llm': only its owner olga, the account team-a, "
        "members of group team-a and members of the admin group ops may"
    )


def test_a_run_from_before_owners_were_recorded_belongs_to_the_instances_account() -> None:
    assert may_act_on_run(ACCOUNT, TEAM, "old", None, "read").allowed
    refused = may_act_on_run(OWNER, TEAM, "old", None, "read")
    assert not refused.allowed and "its owner" not in refused.rule and "the account team-a" in refused.rule


def test_admins_act_on_runs_but_do_not_submit_jobs_that_run_as_the_account() -> None:
    assert may_act_on_instance(ADMIN, TEAM, "clear the quarantine of n1").allowed
    refused = may_submit(ADMIN, TEAM)
    assert not refused.allowed and "its jobs run as team-a" in refused.rule and "ops" not in refused.rule
    assert may_submit(ALICE, TEAM).allowed and may_submit(ACCOUNT, TEAM).allowed
    assert not may_submit(OWNER, TEAM).allowed  # owning an old run is no licence to run new code as the account


def test_a_personal_instance_is_its_owners_alone() -> None:
    mine = Instance(uid=2001, name="alice")
    assert may_submit(Caller(2001, "alice"), mine).allowed
    refused = may_act_on_instance(MALLORY, mine, "read the nodes")
    assert refused.rule.endswith("only the account alice may")


# --------------------------------------------------------------------------- the wire


def raw_exchange(path: Path, payload: bytes, *, shut: bool = True) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        sock.sendall(payload)
        if shut:
            sock.shutdown(socket.SHUT_WR)
        return b"".join(iter(lambda: sock.recv(65536), b""))


@pytest.fixture
def api(tmp_path: Path):
    with local_api(tmp_path / "state") as server:
        yield server


def test_a_caller_cannot_choose_who_signs(api: ApiServer) -> None:
    """The request has no field for the actor: one is refused, not ignored."""
    reply = json.loads(raw_exchange(api.path, b'{"op":"note","run":"x","text":"hi","actor":"head-of-infra"}\n'))
    assert reply["ok"] is False and reply["kind"] == "invalid" and "actor" in reply["error"]


@pytest.mark.parametrize("line", [b'{"op":"drop_tables"}', b"not json", b'{"op":"note","run":"","text":"x"}'])
def test_what_is_not_a_request_is_refused(api: ApiServer, line: bytes) -> None:
    reply = json.loads(raw_exchange(api.path, line + b"\n"))
    assert reply["ok"] is False and reply["kind"] == "invalid"


def test_an_oversize_request_is_refused_and_the_connection_closed(api: ApiServer) -> None:
    big = b'{"op":"note","run":"x","text":"' + b"a" * (wire.MAX_REQUEST_BYTES + 10)
    reply = raw_exchange(api.path, big, shut=False)  # no newline: the server must not wait for one
    assert json.loads(reply) == {"ok": False, "kind": "invalid", "error": "request too long"}


def test_a_silent_client_is_dropped_and_others_are_served(tmp_path: Path) -> None:
    answered: list[bytes] = []
    server = ApiServer(tmp_path / "a.sock", lambda c, line: answered.append(line) or b"{}\n", request_timeout_s=0.3)
    server.start()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as idle:
            idle.connect(str(server.path))
            idle.sendall(b'{"op":')  # and never the rest
            assert raw_exchange(server.path, b'{"op":"whoami"}\n') == b"{}\n"
            idle.settimeout(5)
            assert idle.recv(10) == b""  # closed by the server after its request timeout
    finally:
        server.stop()
    assert answered == [b'{"op":"whoami"}']


def test_connections_beyond_the_cap_are_told_busy(tmp_path: Path) -> None:
    entered, release = threading.Event(), threading.Event()

    def slow(caller: Caller, line: bytes) -> bytes:
        entered.set()
        release.wait(10)
        return b"{}\n"

    server = ApiServer(tmp_path / "a.sock", slow, max_connections=1)
    server.start()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as holder:
            holder.connect(str(server.path))
            holder.sendall(b'{"op":"whoami"}\n')
            assert entered.wait(10)  # the only slot is taken
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as late:
                late.settimeout(10)
                late.connect(str(server.path))
                reply = json.loads(b"".join(iter(lambda: late.recv(65536), b"")))
            release.set()
            assert holder.recv(10) == b"{}\n"
        assert reply["ok"] is False and reply["kind"] == "busy"
    finally:
        release.set()
        server.stop()


def test_a_stale_socket_is_replaced_and_a_live_one_refused(tmp_path: Path) -> None:
    path = tmp_path / "api.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: a crashed daemon's
    first = ApiServer(path, lambda c, line: b"{}\n")
    first.start()
    try:
        assert oct(path.stat().st_mode & 0o777) == "0o666"  # anyone connects; the rules decide
        with pytest.raises(SocketInUse, match="another daemon serves"):
            ApiServer(path, lambda c, line: b"{}\n").start()
    finally:
        first.stop()
    assert not path.exists()


# --------------------------------------------------------------------------- the upgrade path


def test_a_single_user_store_is_adopted_and_its_runs_belong_to_the_instances_account(tmp_path: Path) -> None:
    state = tmp_path / "slurm-supervisor"
    single_user_store(state, state="running")
    account = Instance(uid=2000, name="team-a", group=Group(3000, "team-a"))
    with local_api(state, instance=account) as server:
        client = ApiClient(server.path)
        runs = client.call("runs")  # this process (root) sees all
        assert [(r["spec"]["name"], r["state"], r["restarts_spent"], r["owner_uid"]) for r in runs] == [
            ("legacy", "running", 1, None)
        ]
    from supervisor.api.ops import Operations

    store = SqliteStore(state)
    ops = Operations(store, ManualClock(), account, None)
    for caller, allowed in ((ACCOUNT, True), (ALICE, True), (MALLORY, False)):
        reply = json.loads(ops.answer(caller, b'{"op":"run","run":"legacy"}'))
        assert reply["ok"] is allowed, (caller, reply)


# --------------------------------------------------------------------------- as other accounts


def _need_accounts() -> None:
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("CI runs as root: the tests that act as other accounts must run there")
        pytest.skip("acting as other accounts needs root")


@pytest.fixture(scope="module")
def accounts():
    """A team (group ssv-api-team, member ssv-api-ann), an admin (ssv-api-ops), an outsider."""
    _need_accounts()
    from supervisor.testing.slurm.users import local_user

    team = local_user("ssv-api-team")
    ann = local_user("ssv-api-ann", groups=["ssv-api-team"])
    admin = local_user("ssv-api-adm", groups=["ssv-api-ops"])
    other = local_user("ssv-api-eve")
    import grp

    inst = Instance(
        team.pw_uid,
        "ssv-api-team",
        Group(grp.getgrnam("ssv-api-team").gr_gid, "ssv-api-team"),
        Group(grp.getgrnam("ssv-api-ops").gr_gid, "ssv-api-ops"),
    )
    return {"inst": inst, "ann": ann, "admin": admin, "other": other}


CALLS = """
import json, sys
from supervisor.api.client import ApiClient, ApiFailure
client = ApiClient(sys.argv[1])
for op, args in json.loads(sys.argv[2]):
    try:
        print(json.dumps({"ok": True, "data": client.call(op, **args)}))
    except ApiFailure as exc:
        print(json.dumps({"ok": False, "kind": exc.kind, "error": str(exc)}))
"""


def calls_as(name: str, sock: Path, calls: list[tuple[str, dict]], env: dict[str, str] | None = None):
    """Each call's answer, made by a process that really is account ``name``."""
    from supervisor.testing.slurm.runas import as_account

    argv, how = as_account(name, ["-c", CALLS, str(sock), json.dumps(calls)], env)
    done = subprocess.run(argv, **how, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.fixture
def open_tmp():
    """A folder every account may search (pytest's are 0700, and other pytest sessions close them)."""
    folder = Path(tempfile.mkdtemp(prefix="ssv-api-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def served(open_tmp: Path, accounts):
    tmp_path = open_tmp
    (tmp_path / "train.sbatch").write_text("#!/bin/bash\nsrun true\n")
    spec = tmp_path / "run.toml"
    spec.write_text('[run]\nname = "llm"\nscript = "train.sbatch"\npartition = "main"\nnodes = 2\n')
    for f in (spec, tmp_path / "train.sbatch"):
        f.chmod(0o644)
    with local_api(tmp_path / "state", socket=tmp_path / "api.sock", instance=accounts["inst"]) as server:
        yield server, spec


def test_the_kernel_names_the_caller_whatever_its_environment_says(served, accounts) -> None:
    server, _ = served
    forged = {"LOGNAME": "root", "USER": "root", "SUDO_USER": "root", "SUDO_UID": "0"}
    [who] = calls_as("ssv-api-eve", server.path, [("whoami", {})], forged)
    assert who["data"]["name"] == "ssv-api-eve" and who["data"]["uid"] == accounts["other"].pw_uid


def test_only_the_owner_group_and_admins_act_on_a_run_and_everyone_is_signed_as_who_they_are(served, accounts) -> None:
    server, spec = served
    ann, adm = accounts["ann"], accounts["admin"]
    [submitted] = calls_as("ssv-api-ann", server.path, [("submit", {"spec": str(spec), "slurm_check": False})])
    assert submitted == {"ok": True, "data": "llm"}
    eve = calls_as(
        "ssv-api-eve",
        server.path,
        [("runs", {}), ("run", {"run": "llm"}), ("events", {"run": "llm"}), ("cancel", {"run": "llm"}),
         ("note", {"run": "llm", "text": "mine now"}), ("submit", {"spec": str(spec), "slurm_check": False})],
    )  # fmt: skip
    assert eve[0] == {"ok": True, "data": []}  # sees no run of others
    for reply, verb in zip(eve[1:5], ("read", "read", "cancel", "add a note to"), strict=True):
        assert (
            reply["kind"] == "denied"
            and f"ssv-api-eve (uid {accounts['other'].pw_uid}) may not {verb} run 'llm'" in reply["error"]
        )
        assert "its owner ssv-api-ann" in reply["error"] and "ssv-api-ops" in reply["error"]
    assert eve[5]["kind"] == "denied" and "may not submit" in eve[5]["error"]
    forged = {"LOGNAME": "ssv-api-ann", "USER": "ssv-api-ann"}
    note = [("note", {"run": "llm", "text": "checked the IB links"}), ("run", {"run": "llm"})]
    by_admin = calls_as("ssv-api-adm", server.path, note, forged)
    assert by_admin[0] == {"ok": True, "data": "ssv-api-adm"} and by_admin[1]["ok"]
    store = SqliteStore(server.path.parent / "state")
    events = store.events("llm")
    assert [(e.kind.value, e.actor, e.evidence.get("uid")) for e in events] == [
        ("registered", "ssv-api-ann", ann.pw_uid),
        ("note", "ssv-api-adm", adm.pw_uid),
    ]
    assert store.get_run("llm").owner_uid == ann.pw_uid and not store.get_run("llm").cancel_requested


def test_the_cli_of_another_account_goes_through_the_api(served, accounts) -> None:
    """`LOGNAME=someone slurm-supervisor logbook note …` is signed with the real account."""
    from supervisor.testing.slurm.runas import as_account

    server, spec = served
    tmp_path = server.path.parent
    cfg = tmp_path / "instance.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n[api]\nsocket = "{server.path}"\n')
    cfg.chmod(0o644)
    cli = ["-m", "supervisor", "--config", str(cfg)]

    def run(name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        argv, how = as_account(name, [*cli, *args], env)
        return subprocess.run(argv, **how, cwd="/", capture_output=True, text=True, timeout=60, check=False)

    assert run("ssv-api-ann", "submit", "--no-slurm-check", str(spec)).returncode == 0
    signed = run("ssv-api-ann", "logbook", "note", "llm", "ran the NCCL test", env={"LOGNAME": "root", "USER": "root"})
    assert signed.returncode == 0 and "signed ssv-api-ann" in signed.stdout, signed.stderr
    refused = run("ssv-api-eve", "cancel", "llm")
    assert refused.returncode == 1 and "may not cancel run 'llm'" in refused.stderr
    notes = [e for e in SqliteStore(tmp_path / "state").events("llm") if e.kind.value == "note"]
    assert [n.actor for n in notes] == ["ssv-api-ann"]


def test_refusals_reach_the_client_as_failures(api: ApiServer) -> None:
    with pytest.raises(ApiFailure, match="unknown run 'nope'") as caught:
        ApiClient(api.path).call("cancel", run="nope")
    assert caught.value.kind == "unknown_run"


def test_the_progress_series_is_served_to_a_reader(tmp_path: Path) -> None:
    """Before: the API had no progress op, so `logbook goodput` and the page through a running
    daemon fell back to the time-based account."""
    from supervisor.api.client import RemoteStore
    from supervisor.domain.progress.series import ProgressPoint

    single_user_store(tmp_path / "state", run="llm")
    points = [ProgressPoint("llm", 0, step, 100.0 + step, loss=2.0 - step / 100, step_time_s=1.0) for step in (1, 2, 3)]
    with local_api(tmp_path / "state") as server:
        store = SqliteStore(tmp_path / "state")
        store.record_progress(points)
        assert RemoteStore(ApiClient(server.path)).progress("llm") == store.progress("llm") == points
        with pytest.raises(ApiFailure, match="unknown run"):
            RemoteStore(ApiClient(server.path)).progress("nope")
        store.close()
