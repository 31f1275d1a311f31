"""Jobs that end while the daemon is stopped, forgotten by squeue before it comes back, on a real
Slurm that keeps job accounting (a private MariaDB and slurmdbd: supervisor/testing/accounting.py).

Two runs, each one node: ``done`` finishes well, ``crash`` exits 3 on its first attempt (a fault of
the job: the supervisor restarts it) and keeps running on the next. The daemon is stopped while
both run; both end, and MinJobAge (2 s here) later slurmctld purges them: squeue no longer lists
them. The daemon comes back: it reads their outcomes from sacct and continues each run as it
would have had it seen the jobs end — ``done`` completed, ``crash`` restarted. Before sacct was
read, both runs ended FAILED ("outcome unknown").
"""

from __future__ import annotations

import time

import pytest

from supervisor.adapters.slurm_cli import SlurmCli
from supervisor.testing.daemon import SupervisorProcess, write_run

pytestmark = pytest.mark.slurm

ENDED = ("completed", "failed", "cancelled")

CRASH_ONCE = """\
if [ -e "$MARK" ]; then exec sleep 300; fi
touch "$MARK"
sleep 3
exit 3
"""


def _specs(cluster, tmp_path):
    done = write_run(tmp_path, "done", nodes=1, partition=cluster.partition, script_body="sleep 3\n")
    env = {"MARK": str(tmp_path / "crashed-once")}
    crash = write_run(tmp_path, "crash", nodes=1, partition=cluster.partition, script_body=CRASH_ONCE, env=env)
    with crash.open("a") as spec:
        spec.write("fast_failure_s = 1.0\n")  # an attempt that ran 3 s is not a fast failure: no backoff
    return done, crash


def test_outcomes_of_jobs_squeue_forgot_are_read_from_sacct(make_slurm, tmp_path):
    started = time.monotonic()
    cluster = make_slurm(2, accounting=True, extra_conf={"MinJobAge": "2"})
    print(f"cluster with MariaDB + slurmdbd up in {time.monotonic() - started:.1f} s "
          f"(MariaDB + slurmdbd: {cluster.accounting.seconds:.1f} s)")  # fmt: skip
    sup = SupervisorProcess(cluster, tmp_path, probe=False)
    done, crash = _specs(cluster, tmp_path)
    sup.start()
    try:
        for spec in (done, crash):
            sup.cli("submit", str(spec))  # start() waited for the daemon's API socket
        jobs = [sup.wait_running(name, attempt=0)["job_id"] for name in ("done", "crash")]
    finally:
        assert sup.stop() == 0
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
