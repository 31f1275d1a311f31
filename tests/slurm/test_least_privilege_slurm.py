"""Least privilege on a real Slurm (issue 13): an instance runs as an ordinary account, submits its
runs' jobs as that account and holds no node rights; people reach it only through its local API,
which names them by the kernel and lets only the run's owner, the instance's group and the admin
group act on a run.

The accounts are local test users (``supervisor.testing.slurm.users``); the daemon and each command run
as them for real (``supervisor.testing.slurm.runas``), so Slurm, munge and the API see their UIDs.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from supervisor.api.testing import single_user_store
from supervisor.testing.slurm.runas import as_account
from supervisor.testing.slurm.users import UsersUnavailable, local_user

pytestmark = pytest.mark.slurm

ALICE, CAROL, ADMIN = "ssv-lp-alice", "ssv-lp-carol", "ssv-lp-adm"
ADMINS = "ssv-lp-ops"
CLI = ["-m", "supervisor"]

JOB = """\
id -un > "$OUT/whoami"
echo "${SLURM_SUPERVISOR_TOKEN:+token}" > "$OUT/token"
scontrol update nodename="$SLURMD_NODENAME" state=drain reason="self-service" > "$OUT/drain" 2>&1
echo "rc=$?" >> "$OUT/drain"
sleep 600
"""


@pytest.fixture(scope="module")
def accounts():
    try:
        return {n: local_user(n, groups=[ADMINS] if n == ADMIN else []) for n in (ALICE, CAROL, ADMIN)}
    except UsersUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI runs as root and must make test accounts: {exc}")
        pytest.skip(str(exc))


class Instance:
    """slurm-supervisor@ALICE as the template unit would run it, without systemd: its own config,
    state directory (0700, made by the daemon) and runtime directory for the API's socket."""

    def __init__(self, cluster, base: Path, account: str) -> None:
        self.cluster, self.account = cluster, account
        self.home = base / account
        self.run_dir = self.home / "run"
        self.state = self.home / "state"
        for d in (self.home, self.run_dir):
            d.mkdir(exist_ok=True)
        entry = pwd.getpwnam(account)
        for d in (self.home, self.run_dir):
            os.chown(d, entry.pw_uid, entry.pw_gid)
        self.config = self.home / f"{account}.toml"
        self.config.write_text(
            f'[daemon]\nstate_dir = "{self.state}"\npoll_interval_s = 0.5\n'
            f'[slurm]\nslurm_conf = "{cluster.slurm_conf}"\ncommand_timeout_s = 5.0\n'
            '[probe]\nenabled = false\n[ingest]\nbind = "127.0.0.1"\nport = 0\n'
            f'[api]\nsocket = "{self.run_dir / "api.sock"}"\nadmin_group = "{ADMINS}"\n'
            '[logging]\nformat = "json"\n'
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def as_account(self, name: str, args: list[str], env: dict[str, str] | None = None):
        return as_account(name, args, {"SLURM_CONF": str(self.cluster.slurm_conf), **(env or {})})

    def start(self) -> None:
        log = open(self.home / "daemon.log", "wb")  # noqa: SIM115 - handed to the child
        argv, how = self.as_account(self.account, [*CLI, "daemon", "--config", str(self.config)])
        self.proc = subprocess.Popen(argv, **how, cwd=self.home, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 30
        while not (self.run_dir / "api.sock").exists():
            assert self.proc.poll() is None, (self.home / "daemon.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the daemon's API did not come up"
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def cli(self, name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """``slurm-supervisor --config ALICE.toml ARGS`` run by account ``name``."""
        argv, how = self.as_account(name, [*CLI, "--config", str(self.config), *args], env)
        return subprocess.run(argv, **how, cwd="/", capture_output=True, text=True, timeout=60, check=False)

    def spec(self, name: str, body: str) -> Path:
        script, spec = self.home / f"{name}.sbatch", self.home / f"{name}.toml"
        script.write_text("#!/bin/bash\n" + body)
        spec.write_text(
            f'[run]\nname = "{name}"\nscript = "{script.name}"\npartition = "{self.cluster.partition}"\nnodes = 1\n'
            f'output = "{name}-%j.out"\nenv = {{ OUT = "{self.home}" }}\n'
        )
        for f in (script, spec):
            shutil.chown(f, self.account, self.account)
        return spec


@pytest.fixture
def instance(slurm_cluster, accounts):
    """The instance's folders under a folder of its own that every account may search (pytest's are
    0700, and other pytest sessions close them again)."""
    base = Path(tempfile.mkdtemp(prefix="ssv-lp-"))
    base.chmod(0o755)
    inst = Instance(slurm_cluster, base, ALICE)
    try:
        yield inst
    finally:
        inst.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_an_instance_runs_as_its_account_and_its_jobs_hold_no_node_rights(instance, slurm_cluster, accounts):
    instance.start()
    submitted = instance.cli(ALICE, "submit", str(instance.spec("llm", JOB)))
    assert submitted.returncode == 0, submitted.stderr
    drain = instance.home / "drain"
    slurm_cluster.wait_for(lambda: drain.exists() and "rc=" in drain.read_text(), 60, message="the job's drain attempt")
    jobs = slurm_cluster.run(["squeue", "-h", "-o", "%i %u %T %j"], check=True).stdout.split()
    assert jobs[1:4] == [ALICE, "RUNNING", "llm"], jobs  # squeue shows the job under the account
    assert (instance.home / "whoami").read_text().strip() == ALICE
    assert (instance.home / "token").read_text().strip() == "token"  # the run's token reached its job
    refusal = drain.read_text()
    assert "rc=1" in refusal and "slurm_update error: Invalid user id" in refusal, refusal  # Slurm 22.05.8
    assert not any(s.startswith("drain") for s in slurm_cluster.node_states().values())
    daemon_uid = [
        int(line.split()[1])
        for line in Path(f"/proc/{instance.proc.pid}/status").read_text().splitlines()
        if line.startswith("Uid:")
    ]
    assert daemon_uid == [accounts[ALICE].pw_uid]
    st = instance.state.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (accounts[ALICE].pw_uid, 0o700)  # the daemon's alone
    assert (instance.state / "supervisor.db").stat().st_uid == accounts[ALICE].pw_uid
    rss = next(
        line for line in Path(f"/proc/{instance.proc.pid}/status").read_text().splitlines() if line.startswith("VmRSS")
    )
    print(f"daemon as {ALICE}: {rss}")


def test_a_third_account_cannot_touch_a_run_and_notes_are_signed_by_the_kernels_name(instance, accounts):
    """Also the upgrade path: the instance adopts a store of the single-user layout (moved into its
    state directory and given to its account, as docs/operations.md says) and keeps its runs."""
    single_user_store(instance.state, run="legacy", state="completed")
    subprocess.run(["chown", "-R", f"{ALICE}:{ALICE}", str(instance.state)], check=True)
    instance.start()
    spec = instance.spec("llm", "sleep 600\n")
    assert instance.cli(ALICE, "submit", "--no-slurm-check", str(spec)).returncode == 0
    mine = json.loads(instance.cli(ALICE, "status", "--json").stdout)
    assert [r["name"] for r in mine] == ["legacy", "llm"] and mine[0]["state"] == "completed"
    forged = {"LOGNAME": ALICE, "USER": ALICE}
    listed = instance.cli(CAROL, "status", "--json", env=forged)
    assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stderr  # sees no run of others
    for args, verb in (
        (("status", "llm"), "read"),
        (("cancel", "llm"), "cancel"),
        (("logbook", "note", "llm", "x"), "add a note to"),
    ):
        refused = instance.cli(CAROL, *args, env=forged)
        assert refused.returncode == 1, refused.stdout
        rule = f"{CAROL} (uid {accounts[CAROL].pw_uid}) may not {verb} run 'llm': only the account {ALICE}"
        assert rule in refused.stderr and f"members of the admin group {ADMINS} may" in refused.stderr
    noted = instance.cli(ADMIN, "logbook", "note", "llm", "checked node by hand", env=forged)
    assert noted.returncode == 0 and f"signed {ADMIN}" in noted.stdout, noted.stderr
    book = instance.cli(ADMIN, "logbook", "llm", "--json")
    events = [json.loads(line) for line in book.stdout.splitlines()]
    assert [(e["kind"], e["actor"]) for e in events if e["kind"] in ("registered", "note")] == [
        ("registered", ALICE),
        ("note", ADMIN),
    ]
    assert instance.cli(ALICE, "cancel", "llm").returncode == 0  # the owner may
