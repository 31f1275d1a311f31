"""The simulated cluster behaves like the Slurm 22.05 measured in SLURM-NOTES.md, on virtual time."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from supervisor.domain.cluster import JobState, NodeChange, NodeState, SubmitRequest
from supervisor.ports import Clock, PermanentError, PermissionDenied, Scheduler, TransientError
from supervisor.sim.clock import DEFAULT_START, VirtualClock
from supervisor.sim.slurm.cluster import SimCluster


def request(
    nodes: int = 2,
    *,
    requeue: bool = True,
    exclude: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    name: str = "train",
) -> SubmitRequest:
    return SubmitRequest(
        run="r1",
        script="/bin/true",
        job_name=name,
        partition="main",
        nodes=nodes,
        comment="sup:r1:1",
        exclude=exclude,
        env=env or {},
        requeue=requeue,
    )


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def cluster(clock: VirtualClock) -> SimCluster:
    return SimCluster(clock, 4)


# -- clock ------------------------------------------------------------------------------------


def test_clock_implements_port_and_runs_events_in_time_order(clock: VirtualClock) -> None:
    assert isinstance(clock, Clock)
    assert clock.now() == DEFAULT_START == 1795910400.0
    seen: list[tuple[str, float]] = []
    clock.call_later(5, lambda: seen.append(("b", clock.now())))
    clock.call_later(2, lambda: seen.append(("a", clock.now())))
    clock.call_later(2, lambda: seen.append(("a2", clock.now())))
    assert clock.wait(10) is False
    assert seen == [("a", DEFAULT_START + 2), ("a2", DEFAULT_START + 2), ("b", DEFAULT_START + 5)]
    assert clock.now() == DEFAULT_START + 10


def test_clock_stop_wakes_wait_early(clock: VirtualClock) -> None:
    clock.call_later(3, clock.stop)
    assert clock.wait(100) is True
    assert clock.now() == DEFAULT_START + 3
    assert clock.wait(100) is True and clock.now() == DEFAULT_START + 3
    clock.clear_stop()
    assert clock.wait(1) is False


def test_clock_cancel_and_no_going_back(clock: VirtualClock) -> None:
    fired: list[int] = []
    timer = clock.call_later(1, fired.append, 1)
    timer.cancel()
    clock.advance(5)
    assert fired == []
    with pytest.raises(ValueError):
        clock.advance_to(DEFAULT_START)


@pytest.mark.timing
def test_fifty_four_days_are_cheap(clock: VirtualClock) -> None:
    cluster = SimCluster(clock, 2048)
    job = cluster.submit(request(2000))
    started = time.perf_counter()
    for day in range(54):
        victim = cluster.job_info(job).nodes[day % 7]
        cluster.crash_node(victim)
        clock.advance(3600)
        cluster.restore_node(victim)
        clock.advance(86400 - 3600)
    assert time.perf_counter() - started < 5.0
    assert cluster.job_info(job).restart_count == 54
    assert cluster.job_info(job).state is JobState.RUNNING
    assert all(n.state is not NodeState.DOWN for n in cluster.snapshot().nodes.values())
    assert clock.now() == DEFAULT_START + 54 * 86400


# -- scheduling ---------------------------------------------------------------------------------


def test_submit_schedules_fifo_on_idle_nodes(cluster: SimCluster) -> None:
    assert isinstance(cluster, Scheduler)
    first = cluster.submit(request(3))
    second = cluster.submit(request(2))
    third = cluster.submit(request(1))
    assert (first, second, third) == (1000, 1001, 1002)
    snap = cluster.snapshot()
    assert snap.taken_at == DEFAULT_START
    assert snap.jobs[first].state is JobState.RUNNING
    assert snap.jobs[first].nodes == ("n001", "n002", "n003")
    assert snap.jobs[first].comment == "sup:r1:1" and snap.jobs[first].partition == "main"
    # FIFO: the second job does not fit and blocks the third, which would.
    assert snap.jobs[second].state is JobState.PENDING
    assert snap.jobs[second].state_reason == "Resources"
    assert snap.jobs[third].state is JobState.PENDING
    assert snap.jobs[third].state_reason == "Priority"
    assert snap.nodes["n001"].state is NodeState.ALLOCATED
    assert snap.nodes["n004"].state is NodeState.IDLE


def test_sim_duration_and_exit_code(cluster: SimCluster, clock: VirtualClock) -> None:
    ok = cluster.submit(request(1, env={"SIM_DURATION": "60"}))
    bad = cluster.submit(request(1, env={"SIM_DURATION": "30", "SIM_EXIT_CODE": "3"}))
    forever = cluster.submit(request(1))
    clock.advance(59)
    assert cluster.job_info(ok).state is JobState.RUNNING
    clock.advance(1)
    done, failed = cluster.job_info(ok), cluster.job_info(bad)
    assert (done.state, done.exit_code, done.end_time) == (JobState.COMPLETED, 0, DEFAULT_START + 60)
    assert (failed.state, failed.exit_code, failed.state_reason) == (JobState.FAILED, 3, "NonZeroExitCode")
    clock.advance(10 * 86400)
    assert cluster.job_info(forever).state is JobState.RUNNING


def test_finish_job_frees_nodes_for_the_next(cluster: SimCluster) -> None:
    first = cluster.submit(request(4))
    second = cluster.submit(request(4))
    assert cluster.job_info(second).state is JobState.PENDING
    cluster.finish_job(first, exit_code=0)
    assert cluster.job_info(first).state is JobState.COMPLETED
    assert cluster.job_info(second).state is JobState.RUNNING


def test_exclusion_is_honoured(cluster: SimCluster) -> None:
    job = cluster.submit(request(2, exclude=("n001", "n003")))
    info = cluster.job_info(job)
    assert info.nodes == ("n002", "n004")
    assert info.excluded_nodes == ("n001", "n003")


def test_set_excluded_only_on_pending_jobs(cluster: SimCluster, clock: VirtualClock) -> None:
    blocker = cluster.submit(request(4))
    job = cluster.submit(request(2))
    cluster.set_excluded(job, ["n001", "n002"])
    with pytest.raises(PermanentError):
        cluster.set_excluded(blocker, ["n001"])
    with pytest.raises(PermanentError):
        cluster.set_excluded(job, ["nope"])
    cluster.cancel(blocker)
    info = cluster.job_info(job)
    assert info.state is JobState.RUNNING and info.nodes == ("n003", "n004")


def test_submit_validation(cluster: SimCluster) -> None:
    with pytest.raises(PermanentError):
        cluster.submit(request(5))
    with pytest.raises(PermanentError):
        cluster.submit(request(1, exclude=("x9",)))
    assert cluster.count_calls("submit") == 0
    assert cluster.count_calls("submit", include_failed=True) == 2


# -- node crash ---------------------------------------------------------------------------------


def test_crash_not_responding_then_down_then_requeue(cluster: SimCluster, clock: VirtualClock) -> None:
    job = cluster.submit(request(2))  # n001, n002
    cluster.crash_node("n001")
    clock.advance(9.9)
    assert cluster.node_info("n001").responding
    assert cluster.job_info(job).state is JobState.RUNNING
    clock.advance(0.1)
    node = cluster.node_info("n001")
    assert not node.responding and node.state is NodeState.ALLOCATED
    clock.advance(9.9)
    assert cluster.job_info(job).state is JobState.RUNNING
    clock.advance(0.1)  # t = 20
    node, info = cluster.node_info("n001"), cluster.job_info(job)
    assert node.state is NodeState.DOWN and node.reason == "Not responding"
    assert info.state is JobState.PENDING and info.restart_count == 1
    assert info.state_reason == "BeginTime"
    clock.advance(9.9)
    assert cluster.job_info(job).state is JobState.PENDING
    clock.advance(0.1)  # t = 30: credential expired
    info = cluster.job_info(job)
    assert info.state is JobState.RUNNING and info.nodes == ("n002", "n003")
    assert info.start_time == DEFAULT_START + 30
    log = cluster.incarnation_log
    assert [(i.restart_count, i.start - DEFAULT_START, i.end) for i in log] == [
        (0, 0.0, DEFAULT_START + 20),
        (1, 30.0, None),
    ]
    assert cluster.overlapping_incarnations() == []


def test_non_requeueable_job_ends_node_fail(cluster: SimCluster, clock: VirtualClock) -> None:
    job = cluster.submit(request(1, requeue=False))
    cluster.crash_node("n001")
    clock.advance(20)
    info = cluster.job_info(job)
    assert info.state is JobState.NODE_FAIL and info.restart_count == 0


def test_restore_returns_node_to_service(cluster: SimCluster, clock: VirtualClock) -> None:
    cluster.crash_node("n004")
    clock.advance(25)
    assert cluster.node_info("n004").state is NodeState.DOWN
    cluster.restore_node("n004")
    node = cluster.node_info("n004")
    assert node.state is NodeState.IDLE and node.responding and node.reason == ""
    assert node.schedulable


def test_admin_down_survives_restore(cluster: SimCluster, clock: VirtualClock) -> None:
    cluster.crash_node("n004")
    cluster.set_node_state("n004", NodeChange.DOWN, "bad gpu")
    clock.advance(25)
    cluster.restore_node("n004")
    node = cluster.node_info("n004")
    assert node.state is NodeState.DOWN and node.reason == "bad gpu"


def test_crashed_node_restored_before_timeout_requeues_missing_job(cluster: SimCluster, clock: VirtualClock) -> None:
    job = cluster.submit(request(1))
    cluster.crash_node("n001")
    clock.advance(5)
    cluster.restore_node("n001")
    info = cluster.job_info(job)
    assert info.state is JobState.PENDING and info.restart_count == 1


# -- admin actions --------------------------------------------------------------------------------


def test_admin_down_requeues_at_once(cluster: SimCluster, clock: VirtualClock) -> None:
    job = cluster.submit(request(2))
    clock.advance(100)
    cluster.set_node_state("n002", NodeChange.DOWN, "xid 79")
    info = cluster.job_info(job)
    assert info.state is JobState.PENDING and info.restart_count == 1
    assert cluster.node_info("n002").state is NodeState.DOWN
    assert cluster.incarnation_log[0].end == DEFAULT_START + 100
    clock.advance(10)
    assert cluster.job_info(job).nodes == ("n001", "n003")
    assert cluster.count_calls("set_node_state") == 1


def test_drain_keeps_running_job(cluster: SimCluster, clock: VirtualClock) -> None:
    job = cluster.submit(request(4, env={"SIM_DURATION": "100"}))
    cluster.set_node_state("n001", NodeChange.DRAIN, "ecc")
    node = cluster.node_info("n001")
    assert node.drained and node.state is NodeState.ALLOCATED and node.reason == "ecc"
    assert cluster.job_info(job).state is JobState.RUNNING
    clock.advance(100)
    assert cluster.job_info(job).state is JobState.COMPLETED
    node = cluster.node_info("n001")
    assert node.state is NodeState.IDLE and node.drained and not node.schedulable
    nxt = cluster.submit(request(3))
    assert cluster.job_info(nxt).nodes == ("n002", "n003", "n004")
    cluster.set_node_state("n001", NodeChange.RESUME, "")
    assert cluster.node_info("n001").schedulable
    with pytest.raises(PermanentError):
        cluster.set_node_state("n001", NodeChange.RESUME, "")


def test_permission_denied_without_node_rights(clock: VirtualClock) -> None:
    cluster = SimCluster(clock, 2, node_rights=False)
    with pytest.raises(PermissionDenied):
        cluster.set_node_state("n001", NodeChange.DRAIN, "x")
    assert not cluster.node_info("n001").drained
    assert cluster.failed_calls == [("set_node_state", "n001", NodeChange.DRAIN, "x")]


# -- requeue / hold / cancel ------------------------------------------------------------------------


def test_requeue_waits_for_cred_expire(cluster: SimCluster, clock: VirtualClock) -> None:
    job = cluster.submit(request(2))
    cluster.requeue(job)
    info = cluster.job_info(job)
    assert info.state is JobState.PENDING and info.restart_count == 1
    with pytest.raises(PermanentError):
        cluster.requeue(job)  # already pending
    clock.advance(9.99)
    assert cluster.job_info(job).state is JobState.PENDING
    clock.advance(0.01)
    assert cluster.job_info(job).state is JobState.RUNNING
    assert cluster.count_calls("requeue") == 1


def test_requeue_held_needs_release(cluster: SimCluster, clock: VirtualClock) -> None:
    job = cluster.submit(request(1))
    cluster.requeue(job, hold=True)
    clock.advance(60)
    info = cluster.job_info(job)
    assert info.state is JobState.PENDING and info.held and info.state_reason == "JobHeldUser"
    cluster.release(job)
    assert cluster.job_info(job).state is JobState.RUNNING


def test_hold_pending_job(cluster: SimCluster, clock: VirtualClock) -> None:
    blocker = cluster.submit(request(4))
    job = cluster.submit(request(1))
    cluster.hold(job)
    cluster.cancel(blocker)
    assert cluster.job_info(job).state is JobState.PENDING
    cluster.release(job)
    assert cluster.job_info(job).state is JobState.RUNNING


def test_requeue_refused_for_non_requeueable(cluster: SimCluster) -> None:
    job = cluster.submit(request(1, requeue=False))
    with pytest.raises(PermanentError):
        cluster.requeue(job)


def test_cancel(cluster: SimCluster) -> None:
    job = cluster.submit(request(2))
    cluster.cancel(job)
    info = cluster.job_info(job)
    assert info.state is JobState.CANCELLED and info.term_signal == 15
    cluster.cancel(job)  # already ended: no error
    assert cluster.node_info("n001").state is NodeState.IDLE
    cluster.cancel(4242)  # unknown: not an error, like scancel
    with pytest.raises(PermanentError):
        cluster.hold(job)


def test_finished_jobs_vanish_after_min_job_age(cluster: SimCluster, clock: VirtualClock) -> None:
    job = cluster.submit(request(1, env={"SIM_DURATION": "10"}))
    clock.advance(10 + 299)
    assert cluster.snapshot().jobs[job].state is JobState.COMPLETED
    clock.advance(1)
    assert job not in cluster.snapshot().jobs
    cluster.cancel(job)  # purged: not an error (it has ended)
    with pytest.raises(PermanentError):
        cluster.release(job)


# -- freeze: the stale copy -----------------------------------------------------------------------


def test_freeze_leaves_stale_incarnation_killed_on_restore(cluster: SimCluster, clock: VirtualClock) -> None:
    job = cluster.submit(request(2))  # n001 (batch), n002
    cluster.freeze_node("n001")
    clock.advance(10)
    assert not cluster.node_info("n001").responding
    clock.advance(10)
    assert cluster.job_info(job).restart_count == 1
    assert cluster.incarnations == {"n001": frozenset({(job, 0)})}
    clock.advance(10)  # the requeued copy starts beside the stale one
    assert cluster.job_info(job).nodes == ("n002", "n003")
    assert cluster.executing(job) == {0, 1}
    assert cluster.incarnations["n001"] == {(job, 0)}
    assert cluster.incarnations["n002"] == {(job, 1)}
    clock.advance(100)
    cluster.restore_node("n001")
    assert cluster.executing(job) == {1}
    stale, fresh = cluster.incarnation_log
    assert stale.end == DEFAULT_START + 130 and fresh.end is None
    assert cluster.overlapping_incarnations() == [(stale, fresh)]
    assert cluster.node_info("n001").state is NodeState.IDLE


def test_crash_kills_processes_at_once(cluster: SimCluster, clock: VirtualClock) -> None:
    job = cluster.submit(request(1))
    cluster.crash_node("n001")
    assert cluster.executing(job) == frozenset()
    assert cluster.incarnation_log[0].end == DEFAULT_START


def test_prolog_failure_drains_and_requeues_held(cluster: SimCluster) -> None:
    cluster.fail_prolog("n001")
    job = cluster.submit(request(1))
    info, node = cluster.job_info(job), cluster.node_info("n001")
    assert info.state is JobState.PENDING and info.held and info.restart_count == 1
    assert info.state_reason == "launch_failed_requeued_held"
    assert node.drained and node.reason == "Prolog error"
    assert cluster.incarnation_log == []


# -- controller ------------------------------------------------------------------------------------


def test_controller_down_refuses_every_call(cluster: SimCluster, clock: VirtualClock) -> None:
    job = cluster.submit(request(1, env={"SIM_DURATION": "50"}))
    cluster.controller_down(True)
    calls: list[Callable[[], object]] = [
        cluster.snapshot,
        lambda: cluster.submit(request(1)),
        lambda: cluster.requeue(job),
        lambda: cluster.hold(job),
        lambda: cluster.release(job),
        lambda: cluster.cancel(job),
        lambda: cluster.set_excluded(job, []),
        lambda: cluster.set_node_state("n001", NodeChange.DRAIN, "x"),
    ]
    for call in calls:
        with pytest.raises(TransientError):
            call()
    assert len(cluster.failed_calls) == len(calls)
    clock.advance(60)
    cluster.controller_down(False)
    assert cluster.snapshot().jobs[job].state is JobState.COMPLETED
    assert cluster.snapshot().nodes["n001"].drained is False


def test_snapshot_values_are_fresh(cluster: SimCluster) -> None:
    job = cluster.submit(request(1))
    before = cluster.snapshot()
    cluster.cancel(job)
    after = cluster.snapshot()
    assert before.jobs[job].state is JobState.RUNNING
    assert after.jobs[job].state is JobState.CANCELLED
