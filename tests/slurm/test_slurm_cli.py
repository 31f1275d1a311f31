"""SlurmCli against a real private Slurm 22.05 cluster (LocalSlurm: n1..n4, partition main)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.adapters.slurm.cli import SlurmCli
from supervisor.domain.cluster import JobInfo, JobState, NodeChange, NodeInfo, SubmitRequest
from supervisor.ports import PermanentError, TransientError
from supervisor.testing import LocalSlurm

pytestmark = pytest.mark.slurm


@pytest.fixture
def cli(slurm_cluster: LocalSlurm) -> SlurmCli:
    return SlurmCli(slurm_conf=str(slurm_cluster.slurm_conf), env=slurm_cluster.env, timeout=20.0)


def request(cluster: LocalSlurm, body: str, **overrides: object) -> SubmitRequest:
    scripts = cluster.root / "scripts"
    scripts.mkdir(exist_ok=True)
    script = scripts / f"job-{time.monotonic_ns()}.sh"
    script.write_text(f"#!/bin/sh\n{body}\n")
    fields: dict = dict(
        run="r1",
        script=str(script),
        job_name="sup-test",
        partition=cluster.partition,
        nodes=1,
        comment="sup:r1:i1",
        workdir=str(cluster.root),
        output=str(cluster.root / "out-%j.txt"),
    )
    fields.update(overrides)
    return SubmitRequest(**fields)


def wait_job(
    cluster: LocalSlurm,
    cli: SlurmCli,
    job_id: int,
    predicate: Callable[[JobInfo], bool],
    what: str,
    timeout: float = 30.0,
) -> JobInfo:
    def check() -> JobInfo | None:
        job = cli.snapshot().jobs.get(job_id)
        return job if job is not None and predicate(job) else None

    return cluster.wait_for(check, timeout, message=f"job {job_id} {what}")


def wait_node(
    cluster: LocalSlurm,
    cli: SlurmCli,
    name: str,
    predicate: Callable[[NodeInfo], bool],
    what: str,
    timeout: float = 30.0,
) -> NodeInfo:
    def check() -> NodeInfo | None:
        node = cli.snapshot().nodes[name]
        return node if predicate(node) else None

    return cluster.wait_for(check, timeout, interval=0.2, message=f"node {name} {what}")


def running(job: JobInfo) -> bool:
    return job.state is JobState.RUNNING


def over(job: JobInfo) -> bool:
    return job.state.finished and not job.completing


def test_submit_snapshot_cancel(slurm_cluster: LocalSlurm, cli: SlurmCli) -> None:
    comment = "sup:r1:intent-7, with spaces=and:colons"
    req = request(
        slurm_cluster,
        'echo "value=$SUP_VALUE"\nexec sleep 300',
        comment=comment,
        env={"SUP_VALUE": "a,b c=d 'q'"},
        requeue=True,
    )
    job_id = cli.submit(req)
    job = wait_job(slurm_cluster, cli, job_id, running, "running")
    assert (job.name, job.comment, job.partition, job.restart_count) == ("sup-test", comment, "main", 0)
    assert len(job.nodes) == 1 and not job.held and job.start_time and job.exit_code is None
    snap = cli.snapshot()
    assert [j.job_id for j in snap.jobs_with_comment(comment)] == [job_id]
    for name in slurm_cluster.nodes:
        node = snap.nodes[name]
        assert (node.address, node.port, node.partitions) == ("127.0.0.1", slurm_cluster.node_ports[name], ("main",))
    out = slurm_cluster.root / f"out-{job_id}.txt"
    slurm_cluster.wait_for(lambda: out.exists() and "value=" in out.read_text(), 10, message="job output")
    assert out.read_text().strip() == "value=a,b c=d 'q'"
    cli.cancel(job_id)
    ended = wait_job(slurm_cluster, cli, job_id, over, "cancelled")
    assert ended.state is JobState.CANCELLED and ended.term_signal == 15
    cli.cancel(job_id)  # already ended: not an error
    cli.cancel(9_999_999)  # unknown: not an error either


def test_exit_codes(slurm_cluster: LocalSlurm, cli: SlurmCli) -> None:
    ok = cli.submit(request(slurm_cluster, "true"))
    three = cli.submit(request(slurm_cluster, "exit 3"))
    killed = cli.submit(request(slurm_cluster, "kill -9 $$"))
    jobs = {j: wait_job(slurm_cluster, cli, j, over, "finished") for j in (ok, three, killed)}
    assert (jobs[ok].state, jobs[ok].exit_code) == (JobState.COMPLETED, 0)
    assert (jobs[three].state, jobs[three].exit_code, jobs[three].term_signal) == (JobState.FAILED, 3, None)
    assert (jobs[killed].exit_code, jobs[killed].term_signal) == (None, 9)
    assert jobs[three].end_time and jobs[three].start_time


def test_requeue_hold_release(slurm_cluster: LocalSlurm, cli: SlurmCli) -> None:
    first = cli.submit(request(slurm_cluster, "exec sleep 300", requeue=True))
    second = cli.submit(request(slurm_cluster, "exec sleep 300", requeue=True))
    for job_id in (first, second):
        wait_job(slurm_cluster, cli, job_id, running, "running")
    cli.requeue(first)
    cli.requeue(second, hold=True)
    requeued = wait_job(slurm_cluster, cli, first, lambda j: j.state is JobState.PENDING, "requeued")
    assert requeued.restart_count == 1 and not requeued.held and requeued.nodes == ()
    held = wait_job(slurm_cluster, cli, second, lambda j: j.state is JobState.PENDING, "requeued held")
    assert held.restart_count == 1 and held.held
    cli.hold(first)
    assert wait_job(slurm_cluster, cli, first, lambda j: j.held, "held").state_reason == "JobHeldAdmin"
    cli.release(first)
    cli.release(second)
    for job_id in (first, second):
        wait_job(slurm_cluster, cli, job_id, lambda j: not j.held, "released")


def test_set_excluded_on_pending_job(slurm_cluster: LocalSlurm, cli: SlurmCli) -> None:
    job_id = cli.submit(request(slurm_cluster, "true", exclude=("n2",), extra_args=("--hold",)))
    job = wait_job(slurm_cluster, cli, job_id, lambda j: j.state is JobState.PENDING, "pending")
    assert job.held and job.excluded_nodes == ("n2",)
    cli.set_excluded(job_id, ["n3", "n1"])
    assert cli.snapshot().jobs[job_id].excluded_nodes == ("n1", "n3")
    cli.set_excluded(job_id, [])
    assert cli.snapshot().jobs[job_id].excluded_nodes == ()


def test_node_drain_down_resume(slurm_cluster: LocalSlurm, cli: SlurmCli) -> None:
    cli.set_node_state("n4", NodeChange.DRAIN, "sup: drained by test")
    cli.set_node_state("n3", NodeChange.DOWN, "sup: down by test")
    nodes = cli.snapshot().nodes
    assert nodes["n4"].drained and not nodes["n4"].schedulable and nodes["n4"].reason == "sup: drained by test"
    assert nodes["n3"].down and nodes["n3"].reason == "sup: down by test"
    cli.set_node_state("n3", NodeChange.DRAIN, "sup: down and drained")
    assert cli.snapshot().nodes["n3"].down and cli.snapshot().nodes["n3"].drained
    for name in ("n3", "n4"):
        cli.set_node_state(name, NodeChange.RESUME, "")
    # A resumed node shows IDLE + NOT_RESPONDING until its slurmd answers the controller's
    # ping (~1 s), whether it was DOWN or only drained.
    for name in ("n3", "n4"):
        node = wait_node(slurm_cluster, cli, name, lambda n: n.idle, "idle again", timeout=15)
        assert not node.drained and node.reason == ""


def test_bad_requests_are_permanent(cli: SlurmCli) -> None:
    with pytest.raises(PermanentError, match="Invalid node name"):
        cli.set_node_state("nosuchnode", NodeChange.DRAIN, "x")
    with pytest.raises(PermanentError, match="Invalid job id"):
        cli.hold(9_999_999)
    with pytest.raises(PermanentError):
        cli.submit(SubmitRequest(run="r", script="/bin/true", job_name="x", partition="nosuch", nodes=1, comment="c"))


def test_controller_down_snapshot_is_transient(slurm_cluster: LocalSlurm, cli: SlurmCli) -> None:
    slurm_cluster.stop_controller()
    try:
        started = time.monotonic()
        with pytest.raises(TransientError):
            cli.snapshot()
        assert time.monotonic() - started < cli.timeout
        quick = SlurmCli(slurm_conf=str(slurm_cluster.slurm_conf), env=slurm_cluster.env, timeout=1.0)
        started = time.monotonic()
        with pytest.raises(TransientError):
            quick.snapshot()
        assert time.monotonic() - started < 3.0
        with pytest.raises(TransientError):
            quick.submit(request(slurm_cluster, "true"))
    finally:
        slurm_cluster.start_controller()
    assert set(cli.snapshot().nodes) == set(slurm_cluster.nodes)


def test_job_processes_live_in_their_node_cgroup(slurm_cluster: LocalSlurm, cli: SlurmCli) -> None:
    job_id = cli.submit(request(slurm_cluster, "exec sleep 300"))
    node = wait_job(slurm_cluster, cli, job_id, running, "running").nodes[0]

    def sleeper() -> int | None:
        for pid in slurm_cluster.node_pids(node):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if cmdline[:2] == [b"sleep", b"300"]:
                return pid
        return None

    pid = slurm_cluster.wait_for(sleeper, 10, message="job process in the node's cgroup")
    slurm_cluster.freeze_node(node)
    assert Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("S", "D", "T", "R")
    slurm_cluster.thaw_node(node)
    slurm_cluster.crash_node(node)
    assert slurm_cluster.node_pids(node) == [] and slurm_cluster.slurmd_pid(node) is None
    slurm_cluster.restart_node(node)
    assert slurm_cluster.slurmd_pid(node) is not None
