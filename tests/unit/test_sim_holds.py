"""The simulated cluster hands out the same typed hold and node facts the Slurm adapter reads from
Slurm's wording, so the policy decides the same way on both."""

from __future__ import annotations

from supervisor.domain.cluster import JobHold, SubmitRequest
from supervisor.sim.clock import VirtualClock
from supervisor.sim.slurm.cluster import SimCluster


def request(requeue: bool = True) -> SubmitRequest:
    return SubmitRequest(
        run="r1", script="/bin/true", job_name="train", partition="main", nodes=1, comment="c", requeue=requeue
    )


def test_a_prolog_failure_is_a_launch_failure_hold_on_a_prolog_drained_node() -> None:
    cluster = SimCluster(VirtualClock(), 4)
    cluster.fail_prolog("n001")
    job = cluster.submit(request())
    assert cluster.job_info(job).hold is JobHold.LAUNCH_FAILED
    assert cluster.node_info("n001").prolog_failed
    assert not cluster.node_info("n002").prolog_failed


def test_a_requested_hold_is_the_users_and_release_clears_it() -> None:
    clock = VirtualClock()
    cluster = SimCluster(clock, 4)
    job = cluster.submit(request())
    assert cluster.job_info(job).hold is JobHold.NONE
    cluster.requeue(job, hold=True)
    clock.advance(60)
    assert cluster.job_info(job).hold is JobHold.USER
    cluster.release(job)
    assert cluster.job_info(job).hold is JobHold.NONE
