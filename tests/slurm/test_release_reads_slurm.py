"""The reads that broke on Slurm 24.11 and 26.05, pinned on the real Slurm of each release in the
matrix (scripts/test --slurm-release R; docs/slurm-releases.md):

1. a job read by id lost its exit code and signal (squeue -O exit_code prints code:signal from
   24.11 on): a job exiting 93 was restarted;
2. sinfo --json carried no node address: the slurmd probe had only node names, which do not resolve
   here (n1, n2...), and a dead node was seen only after SlurmdTimeout;
3. the unscoped squeue --json dropped finished jobs (24.05+ honours the default state filter).
"""

from __future__ import annotations

import time

import pytest

from supervisor.adapters.slurm.cli import SlurmCli
from supervisor.adapters.slurm.reads import own_user
from supervisor.domain.cluster import JobState
from supervisor.testing.slurm.daemon import SupervisorProcess, write_run

pytestmark = pytest.mark.slurm


def submit(cluster, *script: str) -> int:
    done = cluster.run(["sbatch", "--parsable", "-N1", "--wrap", "; ".join(script)], check=True)
    return int(done.stdout.strip().split(";")[0])


def wait_job_ended(cli: SlurmCli, job_id: int, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = cli.snapshot_of(frozenset({job_id}), False).jobs.get(job_id)
        if job is not None and job.state.finished:
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not end within {timeout} s")


def test_a_job_read_by_id_keeps_its_exit_code_and_signal(slurm_cluster):
    """One job by id, as a daemon with one run (and any daemon running as root) reads it."""
    cli = SlurmCli(slurm_conf=str(slurm_cluster.slurm_conf), env=slurm_cluster.env, user=own_user())
    exited = wait_job_ended(cli, submit(slurm_cluster, "exit 93"))
    killed = wait_job_ended(cli, submit(slurm_cluster, "kill -9 $$"))
    assert (exited.state, exited.exit_code, exited.term_signal) == (JobState.FAILED, 93, None)
    assert killed.state is JobState.FAILED and killed.term_signal == 9 and killed.exit_code is None


def test_a_run_whose_job_exits_93_is_given_up_not_restarted(slurm_cluster, tmp_path):
    """93 is the default do-not-restart code (nvidia-resiliency-ext's): on 24.11 and 26.05 the run
    was restarted, its exit code lost in the by-id read."""
    sup = SupervisorProcess(slurm_cluster, tmp_path)
    spec = write_run(tmp_path, "llm", nodes=1, partition=slurm_cluster.partition, script_body="sleep 1; exit 93\n")
    sup.start()
    try:
        sup.cli("submit", str(spec))
        status = sup.wait_ended("llm", 45)
    finally:
        assert sup.stop() == 0
    assert status["state"] == "failed", status
    assert status["restarts"]["spent"] == 0, status
    given_up = [e for e in sup.logbook("llm") if e["kind"] == "gave_up"]
    assert given_up and "do-not-restart code 93" in given_up[0]["message"], given_up


def test_node_addresses_are_read_on_every_release(slurm_cluster):
    """Nodes named, as the daemon reads those in focus: each with the address slurmd listens on (the
    harness's NodeAddr), though the names resolve nowhere."""
    cli = SlurmCli(slurm_conf=str(slurm_cluster.slurm_conf), env=slurm_cluster.env, user=own_user())
    some = cli.snapshot_of(frozenset(), frozenset(slurm_cluster.nodes[:2])).nodes
    every = cli.snapshot_of(frozenset(), frozenset(slurm_cluster.nodes)).nodes
    for nodes in (some, every):
        assert {n: nodes[n].address for n in nodes} == dict.fromkeys(nodes, "127.0.0.1"), nodes
        assert all(nodes[n].port for n in nodes), nodes


def test_the_unscoped_read_lists_finished_jobs(slurm_cluster):
    """A tool's or the guard's read (no user): 24.05+ left every finished job out."""
    cli = SlurmCli(slurm_conf=str(slurm_cluster.slurm_conf), env=slurm_cluster.env)
    job_id = submit(slurm_cluster, "exit 3")
    deadline = time.monotonic() + 30
    while (job := cli.snapshot(include_nodes=False).jobs.get(job_id)) is None or not job.state.finished:
        assert time.monotonic() < deadline, f"job {job_id} not seen finished: {job}"
        time.sleep(0.2)
    assert (job.state, job.exit_code) == (JobState.FAILED, 3)
