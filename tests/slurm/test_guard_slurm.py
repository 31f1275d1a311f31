"""The node guard on a real Slurm (the harness's private cluster): the guard runs as root (here also
the SlurmUser), its callers as ordinary local accounts (``ssv-*``) whose jobs run under their own
UIDs. A caller drains a node of its own running job (granted, audited, Slurm shows the guard's
reason); another user's node, an idle node and a forged request are refused and audited; and
Slurm itself refuses an ordinary user's node change (what the guard is for).

The helpers here (the guard process, the callers' environment) serve test_guard_daemons.py too."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from supervisor.adapters.guard_client import GuardClient
from supervisor.adapters.slurm.cli import SlurmCli
from supervisor.domain.cluster import JobState, NodeInfo
from supervisor.testing import LocalSlurm
from supervisor.testing.slurm.users import UsersUnavailable, as_user, local_user, python_for_others

pytestmark = pytest.mark.slurm

ADMINS = "ssv-admins"


@pytest.fixture
def public_tmp() -> Iterator[Path]:
    """A folder the test accounts can reach. Not under pytest's tmp_path: every pytest session
    resets /tmp/pytest-of-root to 0700, which would lock them out mid-test."""
    path = Path(tempfile.mkdtemp(prefix="ssv-guard-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def users(*names: str, admin: str | None = None) -> None:
    """The test accounts (created once per machine); fails under CI=true when they cannot be made."""
    try:
        for name in names:
            local_user(name)
        if admin:
            local_user(admin, groups=[ADMINS])
    except UsersUnavailable as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"test accounts are required under CI=true: {exc}", pytrace=False)
        pytest.skip(str(exc))


def user_env(cluster: LocalSlurm, user: str) -> dict[str, str]:
    python_env = python_for_others()[1]
    return {**cluster.env, **python_env, "HOME": f"/home/{user}", "LANG": "C.UTF-8", "USER": user}


def cli_as(cluster: LocalSlurm, user: str, *args: str, cwd: str = "/") -> subprocess.CompletedProcess[str]:
    """``slurm-supervisor ARGS`` run as ``user``."""
    python = python_for_others()[0]
    return as_user(user, [*python, "-m", "supervisor", *args], env=user_env(cluster, user), cwd=cwd, timeout=60)


def sbatch_as(cluster: LocalSlurm, user: str, nodes: int) -> int:
    argv = ["sbatch", "--parsable", f"-N{nodes}", "--output=/dev/null", "--wrap", "sleep 600"]
    done = as_user(user, argv, env=user_env(cluster, user), cwd="/tmp")
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


def running_nodes(cluster: LocalSlurm, job_id: int, timeout: float = 20.0) -> tuple[str, ...]:
    def check() -> tuple[str, ...] | None:
        job = slurm(cluster).snapshot(include_nodes=False).jobs.get(job_id)
        return job.nodes if job is not None and job.state is JobState.RUNNING else None

    return cluster.wait_for(check, timeout, interval=0.2, message=f"job {job_id} running")


def slurm(cluster: LocalSlurm) -> SlurmCli:
    return SlurmCli(slurm_conf=str(cluster.slurm_conf))


def node(cluster: LocalSlurm, name: str) -> NodeInfo:
    return slurm(cluster).snapshot().nodes[name]


class GuardProcess:
    """``slurm-supervisor guard serve`` as root, binding its own socket (as when run by hand)."""

    def __init__(self, cluster: LocalSlurm, workdir: Path, *, max_drains: int = 8, store: str = "") -> None:
        workdir.mkdir(parents=True, exist_ok=True)  # reachable by the callers (their socket is in it)
        self.socket = workdir / "guard.sock"
        self.state = workdir / "guard-state"
        self.config = workdir / "guard.toml"
        self.config.write_text(
            f'[guard]\nsocket = "{self.socket}"\nstate_dir = "{self.state}"\nadmin_groups = ["{ADMINS}"]\n'
            f"max_drains = {max_drains}\n[quarantine]\nfaults = 1\n"
            f'[slurm]\nslurm_conf = "{cluster.slurm_conf}"\ncommand_timeout_s = 5.0\n'
            '[logging]\nformat = "json"\n' + store  # store: a [store] section (a memory guards share)
        )
        self.log = workdir / "guard.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> GuardProcess:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "supervisor", "guard", "serve", "--config", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        LocalSlurm.wait_for(self._answers, 20, interval=0.1, message="the guard answering")
        return self

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"the guard exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        try:
            with socket.socket(socket.AF_UNIX) as probe:
                probe.connect(str(self.socket))
            return True
        except OSError:
            return False

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.terminate()
        self.proc.wait(15)

    def audit(self) -> list[dict]:
        path = self.state / "audit.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def client(self) -> GuardClient:
        return GuardClient(str(self.socket))


def test_a_user_drains_a_node_of_their_own_job_and_nothing_else(slurm_cluster: LocalSlurm, public_tmp: Path) -> None:
    users("ssv-ga", "ssv-gb", admin="ssv-gadmin")
    cluster = slurm_cluster
    mine = running_nodes(cluster, sbatch_as(cluster, "ssv-ga", 2))
    theirs = running_nodes(cluster, sbatch_as(cluster, "ssv-gb", 1))
    (idle,) = set(cluster.nodes) - set(mine) - set(theirs)
    with GuardProcess(cluster, public_tmp / "guard") as guard:

        def drain(user: str, target: str, cause: str = "XID 79 on GPU 3", run: str = "llm"):
            return cli_as(
                cluster, user, "guard", "drain", target, "--run", run, "--cause", cause, "--socket", str(guard.socket)
            )

        granted = drain("ssv-ga", mine[0])
        assert granted.returncode == 0 and "granted (own-job" in granted.stdout, granted.stdout + granted.stderr
        for target in (theirs[0], idle):
            refused = drain("ssv-ga", target)
            assert refused.returncode == 1 and "refused (not-own-node)" in refused.stderr, refused.stderr
        forged = "ok\nreason=pwned state=resume nodename=" + idle + "\x1b]0;owned\x07\x1b[2J\t" + "A" * 1500
        assert drain("ssv-ga", mine[1], cause=forged).returncode == 0
        assert "bad-request" in drain("ssv-ga", mine[1], run="llm: pwned").stderr
        assert (  # drained by ssv-ga, but not held in its maintenance reservation (docs/guard.md, remedies)
            "not-own-remedy"
            in cli_as(cluster, "ssv-ga", "guard", "resume", mine[0], "--socket", str(guard.socket)).stderr
        )
        first = node(cluster, mine[0])
        assert (
            first.drained and first.reason == "slurm-supervisor: run ssv-ga/llm: XID 79 on GPU 3"
        )  # the caller the kernel names
        second = node(cluster, mine[1]).reason
        assert second.startswith("slurm-supervisor: run ssv-ga/llm: ok reason=pwned state=resume nodename=")
        assert len(second) <= 200 and all(" " <= c <= "~" for c in second), repr(second)
        assert not node(cluster, idle).drained and not node(cluster, theirs[0]).drained
        resumed = cli_as(cluster, "ssv-gadmin", "guard", "resume", mine[0], "--socket", str(guard.socket))
        assert resumed.returncode == 0, resumed.stderr
        assert not node(cluster, mine[0]).drained
    lines = guard.audit()  # once the guard has stopped: it writes its folded refusals then
    seen = [(a["user"], a["node"], a["granted"], a["rule"], a.get("repeats")) for a in lines]
    assert seen == [
        ("ssv-ga", mine[0], True, "own-job", None),
        ("ssv-ga", theirs[0], False, "not-own-node", None),
        ("ssv-ga", mine[1], True, "own-job", None),
        ("ssv-ga", mine[1], False, "bad-request", None),
        ("ssv-ga", mine[0], False, "not-own-remedy", None),
        ("ssv-gadmin", mine[0], True, "admin", None),
        ("ssv-ga", idle, False, "not-own-node", 1),  # the second refusal by one rule, folded
    ]
    assert all(a["uid"] == local_user(a["user"]).pw_uid for a in lines)
    assert lines[2]["cause"].startswith("ok\nreason=pwned") and lines[2]["reason"] == second


def test_slurm_lets_only_root_or_the_slurm_user_change_node_states(slurm_cluster: LocalSlurm) -> None:
    """Measured for docs/guard.md: without slurmdbd (no AdminLevel can be granted), an ordinary user
    may not DOWN, DRAIN or RESUME even a node of their own running job; root (and the SlurmUser,
    which is root on this test cluster) may."""
    users("ssv-ga")
    cluster = slurm_cluster
    (mine,) = running_nodes(cluster, sbatch_as(cluster, "ssv-ga", 1))
    env = user_env(cluster, "ssv-ga")
    for state in ("drain", "down", "resume"):
        argv = ["scontrol", "update", f"nodename={mine}", f"state={state}", "reason=mine"][
            : 4 if state == "resume" else 5
        ]
        done = as_user("ssv-ga", argv, env=env)
        assert done.returncode == 1 and "Invalid user id" in done.stderr, (state, done.stderr)
    assert not node(cluster, mine).drained
    assert cluster.run(["scontrol", "update", f"nodename={mine}", "state=drain", "reason=root"]).returncode == 0
    assert node(cluster, mine).drained


def test_with_slurmdbd_admin_level_administrator_and_nothing_less_may_change_nodes(
    make_slurm: Callable[..., LocalSlurm],
) -> None:
    """Measured for docs/guard.md, with accounting (slurmdbd over MariaDB): AdminLevel Operator
    may not DOWN, DRAIN or RESUME a node (scontrol(1), AUTHORIZATION: "update node: Admin");
    Administrator may — and may then alter anything on slurmctld, which is why no instance gets it."""
    users("ssv-ga", "ssv-gop", "ssv-gadm")
    cluster = make_slurm(2, accounting=True)
    cluster.run(["sacctmgr", "-i", "add", "account", "ssv"], check=True)
    levels = {"ssv-ga": "None", "ssv-gop": "Operator", "ssv-gadm": "Administrator"}
    for user, level in levels.items():
        cluster.run(["sacctmgr", "-i", "add", "user", user, "account=ssv", f"adminlevel={level}"], check=True)

    def change(user: str, state: str) -> bool:
        argv = ["scontrol", "update", f"nodename={cluster.nodes[0]}", f"state={state}"]
        done = as_user(user, [*argv, f"reason={user}"] if state != "resume" else argv, env=user_env(cluster, user))
        assert done.returncode == 0 or "Invalid user id" in done.stderr, done.stderr
        return done.returncode == 0

    cluster.wait_for(lambda: change("ssv-gadm", "drain"), 15, interval=0.3, message="slurmctld knowing the admin")
    outcomes = {(user, state): change(user, state) for user in levels for state in ("resume", "drain", "down")}
    assert outcomes == {
        ("ssv-ga", "resume"): False, ("ssv-ga", "drain"): False, ("ssv-ga", "down"): False,
        ("ssv-gop", "resume"): False, ("ssv-gop", "drain"): False, ("ssv-gop", "down"): False,
        ("ssv-gadm", "resume"): True, ("ssv-gadm", "drain"): True, ("ssv-gadm", "down"): True,
    }  # fmt: skip
