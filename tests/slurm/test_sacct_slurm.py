"""Jobs that end while the daemon is stopped, forgotten by squeue before it comes back, on a real
Slurm that keeps job accounting (a private MariaDB and slurmdbd: supervisor/testing/slurm/accounting.py).

Two runs, each one node: ``done`` finishes well, ``crash`` exits 3 on its first attempt (a fault of
the job: the supervisor restarts it) and keeps running on the next. The daemon is stopped while
both run; both end, and MinJobAge (2 s here) later slurmctld purges them: squeue no longer lists
them. The daemon comes back: it reads their outcomes from sacct and continues each run as it
would have had it seen the jobs end — ``done`` completed, ``crash`` restarted. Before sacct was
read, both runs ended FAILED ("outcome unknown").

A job cancelled by hand (an operator's ``scancel``): sacct names the canceller ("CANCELLED by UID"),
the adapter names the account, and the run's cancelled event names the person (issue 18).

One cluster with accounting serves the module: MariaDB + slurmdbd are the slow part to start.
"""

from __future__ import annotations

import os
import pwd
import time
from collections.abc import Iterator

import pytest

from supervisor.adapters.slurm.cli import SlurmCli
from supervisor.adapters.slurm.sacct import SacctCli
from supervisor.domain.cluster import Canceller, JobState
from supervisor.testing import LocalSlurm, LocalSlurmError, unavailable_reason
from supervisor.testing.slurm.daemon import SupervisorProcess, write_run
from supervisor.testing.slurm.users import UsersUnavailable, as_user, local_user

pytestmark = pytest.mark.slurm

ENDED = ("completed", "failed", "cancelled")

# Both jobs end only once the test says so ($GO), after the daemon stopped: however loaded the
# machine, the daemon never sees them end itself.
WAIT_FOR_GO = 'while [ ! -e "$GO" ]; do sleep 0.2; done\n'
CRASH_ONCE = 'if [ -e "$MARK" ]; then exec sleep 300; fi\ntouch "$MARK"\n' + WAIT_FOR_GO + "exit 3\n"


OPERATOR = "ssv-sacct-op"  # a Slurm operator (AdminLevel=Operator): may cancel any job


def _cannot_run(reason: str) -> None:
    if os.environ.get("CI", "").strip().lower() == "true":
        pytest.fail(f"real Slurm with accounting is required under CI=true but cannot run: {reason}", pytrace=False)
    pytest.skip(f"real Slurm with accounting not available: {reason}")


@pytest.fixture(scope="module")
def accounting_slurm() -> Iterator[LocalSlurm]:
    """Two nodes, MariaDB + slurmdbd, and squeue forgetting ended jobs after 2 s (MinJobAge)."""
    reason = unavailable_reason()
    if reason:
        _cannot_run(reason)
    started = time.monotonic()
    try:
        cluster = LocalSlurm(2, accounting=True, extra_conf={"MinJobAge": "2"}).start()
    except LocalSlurmError as exc:
        _cannot_run(f"LocalSlurm failed to start: {exc}")
    print(f"cluster with MariaDB + slurmdbd up in {time.monotonic() - started:.1f} s")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def operator(accounting_slurm: LocalSlurm) -> pwd.struct_passwd:
    try:
        entry = local_user(OPERATOR)
    except UsersUnavailable as exc:
        _cannot_run(str(exc))
    for argv in (
        ["sacctmgr", "-i", "add", "account", "ssv-ops"],
        ["sacctmgr", "-i", "add", "user", OPERATOR, "account=ssv-ops", "adminlevel=Operator"],
    ):
        accounting_slurm.run(argv, check=True, timeout=30)
    return entry


def _specs(cluster, tmp_path):
    go = {"GO": str(tmp_path / "go")}
    done = write_run(tmp_path, "done", nodes=1, partition=cluster.partition, script_body=WAIT_FOR_GO, env=go)
    env = {"MARK": str(tmp_path / "crashed-once"), **go}
    crash = write_run(tmp_path, "crash", nodes=1, partition=cluster.partition, script_body=CRASH_ONCE, env=env)
    with crash.open("a") as spec:
        spec.write("fast_failure_s = 1.0\n")  # an attempt that ran seconds is not a fast failure: no backoff
    return done, crash


def test_outcomes_of_jobs_squeue_forgot_are_read_from_sacct(accounting_slurm, tmp_path):
    started = time.monotonic()
    cluster = accounting_slurm
    cluster.reset()
    sup = SupervisorProcess(cluster, tmp_path, probe=False)
    done, crash = _specs(cluster, tmp_path)
    sup.start()
    try:
        for spec in (done, crash):
            sup.cli("submit", str(spec))  # start() waited for the daemon's API socket
        jobs = [sup.wait_running(name, attempt=0)["job_id"] for name in ("done", "crash")]
    finally:
        assert sup.stop() == 0
    (tmp_path / "go").touch()
    stopped = time.monotonic()
    squeue = SlurmCli(slurm_conf=str(cluster.slurm_conf))
    wait = cluster.wait_for
    wait(lambda: not set(jobs) & set(squeue.snapshot(include_nodes=False).jobs), 90, message="squeue forgets both jobs")
    print(f"squeue forgot both jobs {time.monotonic() - stopped:.1f} s after the daemon stopped")
    sup.start()
    try:
        ended = wait(lambda: sup.status("done")["state"] in ENDED and sup.status("done"), 30, message="run done ended")
        assert ended["state"] == "completed", sup.logbook("done")[-1]["message"]
        second = sup.wait_running("crash", attempt=1, timeout=30)
    finally:
        sup.stop()
    print(f"test body {time.monotonic() - started:.1f} s")
    assert second["restarts"]["spent"] == 1
    book = {name: sup.logbook(name) for name in ("done", "crash")}
    for name in ("done", "crash"):
        notes = [e for e in book[name] if e["kind"] == "note" and e["evidence"].get("source") == "sacct"]
        assert len(notes) == 1, book[name]
        assert "sacct" in notes[0]["message"] and "MinJobAge" in notes[0]["message"]
        assert not any(e["kind"] == "gave_up" for e in book[name]), book[name]
    assert book["done"][-1]["kind"] == "completed"
    fault = next(e for e in book["crash"] if e["kind"] == "fault")
    assert fault["evidence"]["exit_code"] == 3, fault  # sacct -P's exit code (sacct --json says 0 in 22.05)
    assert any(e["kind"] == "restarted" for e in book["crash"]), book["crash"]


def test_sacct_names_who_cancelled_a_job(accounting_slurm, operator, tmp_path):
    cluster = accounting_slurm
    cluster.reset()
    job_id = int(
        cluster.run(["sbatch", "--parsable", "-N1", "-o", "/dev/null", "--wrap", "sleep 300"], check=True).stdout
    )
    cluster.wait_for(lambda: str(job_id) not in cluster.run(["squeue", "-h", "-t", "PD", "-o", "%i"]).stdout, 20)
    done = as_user(OPERATOR, ["scancel", str(job_id)], env=cluster.env)
    assert done.returncode == 0, done.stderr
    sacct = SacctCli(slurm_conf=str(cluster.slurm_conf))
    record = cluster.wait_for(lambda: (r := sacct.job_records([job_id]).get(job_id)) and r.state.finished and r, 20)
    assert record.state is JobState.CANCELLED
    assert record.cancelled_by == Canceller(operator.pw_uid, OPERATOR)


def test_a_run_whose_job_a_person_cancels_names_them_in_the_logbook(accounting_slurm, operator, tmp_path):
    cluster = accounting_slurm
    cluster.reset()
    sup = SupervisorProcess(cluster, tmp_path, probe=False)
    spec = write_run(tmp_path, "handoff", nodes=1, partition=cluster.partition, script_body="sleep 300\n")
    sup.start()
    try:
        sup.cli("submit", str(spec))
        job_id = sup.wait_running("handoff", attempt=0)["job_id"]
        time.sleep(10.5)  # past the launch window: a cancel as the job starts may be its prolog's
        done = as_user(OPERATOR, ["scancel", str(job_id)], env=cluster.env)
        assert done.returncode == 0, done.stderr
        cluster.wait_for(lambda: sup.status("handoff")["state"] == "cancelled", 30, message="run cancelled")
    finally:
        sup.stop()
    book = sup.logbook("handoff")
    via = "sacct after squeue forgot it" if any(e["evidence"].get("source") == "sacct" for e in book) else "squeue"
    print(f"the daemon saw the cancel through {via}")  # either way accounting names the person
    event = next(e for e in book if e["kind"] == "cancelled")
    uid = operator.pw_uid
    assert event["message"] == (
        f"job {job_id} was cancelled by {OPERATOR} (uid {uid}) outside the supervisor; not restarting"
    )
    assert event["actor"] == OPERATOR and event["evidence"]["cancelled_by_uid"] == uid
