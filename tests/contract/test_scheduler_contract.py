"""One contract for the Scheduler port, run against the simulated cluster and a real Slurm 22.05.

Every case runs twice through the ``world`` fixture: ``sim`` (``SimCluster`` on a
``VirtualClock``: waiting advances virtual time) and ``slurm`` (``SlurmCli`` against the session's
private LocalSlurm, 4 nodes, reset before each test: waiting polls in real time). A case that holds
for one and not the other is a disagreement between the simulator and the real adapter; it is
marked ``xfail(strict=True)`` for the side that disagrees, with the reason, so it stays visible.

Times given to ``wait_until`` are seconds of the world's own time (virtual in ``sim``), so a timing
claim ("NODE_FAIL within a few seconds") is checked the same way on both sides.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import pytest

from supervisor.adapters.slurm.cli import SlurmCli
from supervisor.domain.cluster import JobInfo, JobState, NodeChange, NodeInfo, NodeState, SubmitRequest
from supervisor.ports import PermanentError, Scheduler
from supervisor.sim.clock import VirtualClock
from supervisor.sim.slurm.cluster import SimCluster
from supervisor.sim.slurm.records import ENV_DURATION, ENV_EXIT_CODE
from supervisor.testing import LocalSlurm

T = TypeVar("T")

UNKNOWN_JOB = 9_999_999
# The supervisor's own tag shape: ':' separated, so it must come back untouched.
COMMENT = "slurm-supervisor:run-a:intent:7"


# ---------------------------------------------------------------------------- the two worlds


class World:
    """What a contract case needs from either side; subclasses supply time and fault injection."""

    kind: str
    scheduler: Scheduler
    nodes: tuple[str, ...]
    partition: str

    def _script(self, name: str, seconds: float | None, exit_code: int) -> str:
        raise NotImplementedError

    def _paths(self, name: str) -> dict[str, str]:
        return {}

    def now(self) -> float:
        raise NotImplementedError

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` of this world's time pass."""
        raise NotImplementedError

    def crash_node(self, name: str) -> None:
        raise NotImplementedError

    def _poll(self, check: Callable[[], T | None], timeout: float, what: str) -> T:
        raise NotImplementedError

    # -- shared helpers

    def request(
        self,
        name: str,
        nodes: int = 1,
        *,
        seconds: float | None = None,
        exit_code: int = 0,
        exclude: Sequence[str] = (),
        requeue: bool = False,
        comment: str = COMMENT,
    ) -> SubmitRequest:
        """A batch job that runs ``seconds`` (None: until cancelled) and then exits ``exit_code``."""
        env = {} if seconds is None else {ENV_DURATION: f"{seconds:g}", ENV_EXIT_CODE: str(exit_code)}
        return SubmitRequest(
            run="contract",
            script=self._script(name, seconds, exit_code),
            job_name=name,
            partition=self.partition,
            nodes=nodes,
            comment=comment,
            exclude=tuple(exclude),
            env=env,
            requeue=requeue,
            **self._paths(name),
        )

    def wait_until(self, predicate: Callable[[], T | None], timeout: float, what: str = "condition") -> T:
        """Wait (up to ``timeout`` s of this world's time) until ``predicate()`` is truthy; return it."""
        return self._poll(predicate, timeout, what)

    def job(self, job_id: int) -> JobInfo:
        snap = self.scheduler.snapshot()
        assert job_id in snap.jobs, f"job {job_id} missing from the snapshot"
        return snap.jobs[job_id]

    def node(self, name: str) -> NodeInfo:
        return self.scheduler.snapshot().nodes[name]

    def wait_job(self, job_id: int, predicate: Callable[[JobInfo], bool], what: str, timeout: float = 20.0) -> JobInfo:
        def check() -> JobInfo | None:
            job = self.scheduler.snapshot().jobs.get(job_id)
            return job if job is not None and predicate(job) else None

        return self.wait_until(check, timeout, f"job {job_id} {what}")

    def wait_node(self, name: str, predicate: Callable[[NodeInfo], bool], what: str, timeout: float = 20.0) -> NodeInfo:
        def check() -> NodeInfo | None:
            node = self.scheduler.snapshot().nodes[name]
            return node if predicate(node) else None

        return self.wait_until(check, timeout, f"node {name} {what}")

    def submit_running(self, request: SubmitRequest) -> JobInfo:
        job_id = self.scheduler.submit(request)
        return self.wait_job(job_id, running, "running")

    def pending_behind_blocker(self, name: str, *, exclude: Sequence[str] = ()) -> tuple[JobInfo, JobInfo]:
        """A long job on every node, then a 1-node job that must wait for it: (blocker, pending)."""
        blocker = self.submit_running(self.request(f"{name}-blocker", len(self.nodes)))
        job_id = self.scheduler.submit(self.request(name, 1, exclude=exclude))
        pending = self.wait_job(job_id, lambda j: j.state is JobState.PENDING, "pending", timeout=5)
        return blocker, pending


class SimWorld(World):
    kind = "sim"
    STEP = 0.25

    def __init__(self) -> None:
        self.clock = VirtualClock()
        self.cluster = SimCluster(self.clock, 4)
        self.scheduler = self.cluster
        self.nodes = self.cluster.node_names
        self.partition = self.cluster.partition

    def _script(self, name: str, seconds: float | None, exit_code: int) -> str:
        return f"/sim/{name}.sh"

    def now(self) -> float:
        return self.clock.now()

    def sleep(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def crash_node(self, name: str) -> None:
        self.cluster.crash_node(name)

    def _poll(self, check: Callable[[], T | None], timeout: float, what: str) -> T:
        deadline = self.clock.now() + timeout
        while True:
            value = check()
            if value:
                return value
            if self.clock.now() >= deadline:
                raise TimeoutError(f"{what} not reached within {timeout} s (virtual)")
            self.clock.advance(self.STEP)


class SlurmWorld(World):
    kind = "slurm"
    POLL = 0.2

    def __init__(self, cluster: LocalSlurm, tmp: Path) -> None:
        self.cluster = cluster
        self.tmp = tmp
        self.scheduler = SlurmCli(slurm_conf=str(cluster.slurm_conf), env=cluster.env, timeout=20.0)
        self.nodes = tuple(cluster.nodes)
        self.partition = cluster.partition

    def _script(self, name: str, seconds: float | None, exit_code: int) -> str:
        body = "exec sleep 3600" if seconds is None else f"sleep {seconds:g}\nexit {exit_code}"
        script = self.tmp / f"{name}.sh"
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(0o755)
        return str(script)

    def _paths(self, name: str) -> dict[str, str]:
        return {"output": str(self.tmp / f"{name}-%j.out"), "workdir": str(self.tmp)}

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def crash_node(self, name: str) -> None:
        self.cluster.crash_node(name)

    def _poll(self, check: Callable[[], T | None], timeout: float, what: str) -> T:
        return self.cluster.wait_for(check, timeout, interval=self.POLL, message=what)


@pytest.fixture(
    params=[
        pytest.param("sim", id="sim"),
        pytest.param("slurm", id="slurm", marks=pytest.mark.slurm),
    ]
)
def world(request: pytest.FixtureRequest, tmp_path: Path) -> World:
    if request.param == "sim":
        return SimWorld()
    return SlurmWorld(request.getfixturevalue("slurm_cluster"), tmp_path)


def disagree(request: pytest.FixtureRequest, world: World, side: str, reason: str) -> None:
    """Mark the running case as a known, strict failure on ``side`` only."""
    if world.kind == side:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


def running(job: JobInfo) -> bool:
    return job.state is JobState.RUNNING


def over(job: JobInfo) -> bool:
    return job.state.finished and not job.completing


# ---------------------------------------------------------------------------- snapshot and submit


def test_snapshot_lists_every_node_idle_and_every_job(world: World) -> None:
    snap = world.scheduler.snapshot()
    assert sorted(snap.nodes) == sorted(world.nodes)
    for name in world.nodes:
        node = snap.nodes[name]
        assert node.name == name
        assert world.partition in node.partitions
        assert node.state is NodeState.IDLE and node.idle and node.responding and not node.drained
    assert sorted(n.name for n in snap.partition_nodes(world.partition)) == sorted(world.nodes)

    # Jobs of every kind and every submitter's tag are listed: nothing is filtered.
    done = world.scheduler.submit(world.request("all-done", seconds=0, comment="other:run:1"))
    world.wait_job(done, over, "finished")
    whole = world.submit_running(world.request("all-big", len(world.nodes) - 1, comment="x:1"))
    small = world.submit_running(world.request("all-small", 1, comment="y:2"))
    waiting = world.scheduler.submit(world.request("all-waiting", 1, comment="z:3"))
    snap = world.scheduler.snapshot()
    assert {done, whole.job_id, small.job_id, waiting} <= set(snap.jobs)
    assert snap.jobs[done].state is JobState.COMPLETED
    assert snap.jobs[waiting].state is JobState.PENDING
    assert {j.state for j in (snap.jobs[whole.job_id], snap.jobs[small.job_id])} == {JobState.RUNNING}
    assert [j.job_id for j in snap.jobs_with_comment("z:3")] == [waiting]
    busy = set(whole.nodes) | set(small.nodes)
    assert busy == set(world.nodes)
    assert all(snap.nodes[n].state is NodeState.ALLOCATED for n in busy)


def test_submit_shows_request_and_runs_outside_excluded(world: World) -> None:
    a, b, c, d = world.nodes
    first = world.scheduler.submit(world.request("contract-sub", 2, exclude=(a, c)))
    second = world.scheduler.submit(world.request("contract-sub2", 1, comment="x"))
    assert isinstance(first, int) and first > 0 and second != first
    job = world.wait_job(first, running, "running")
    assert job.job_id == first
    assert job.name == "contract-sub"
    assert job.comment == COMMENT
    assert job.partition == world.partition
    assert set(job.excluded_nodes) == {a, c} and len(job.excluded_nodes) == 2
    assert len(job.nodes) == 2 and set(job.nodes) == {b, d}
    assert job.restart_count == 0 and not job.held and job.start_time is not None
    assert job.exit_code is None
    # The second (1 node) has nowhere to go but a or c.
    other = world.wait_job(second, running, "running")
    assert len(other.nodes) == 1 and other.nodes[0] in (a, c)


def test_excluded_nodes_are_reported_in_node_order(world: World) -> None:
    a, b, c, d = world.nodes
    job_id = world.scheduler.submit(world.request("contract-order", 1, exclude=(d, b)))
    assert world.job(job_id).excluded_nodes == (b, d)


# ---------------------------------------------------------------------------- ends of jobs


def test_exit_codes_and_finished_jobs_stay_visible(world: World) -> None:
    ok = world.scheduler.submit(world.request("contract-ok", seconds=1, exit_code=0))
    bad = world.scheduler.submit(world.request("contract-bad", seconds=1, exit_code=3))
    started = world.now()
    ended = {j: world.wait_job(j, over, "finished", timeout=15) for j in (ok, bad)}
    assert world.now() - started >= 1  # they really ran for their second
    assert (ended[ok].state, ended[ok].exit_code, ended[ok].term_signal) == (JobState.COMPLETED, 0, None)
    assert (ended[bad].state, ended[bad].exit_code, ended[bad].term_signal) == (JobState.FAILED, 3, None)
    assert ended[bad].end_time is not None and ended[bad].start_time is not None
    world.sleep(2)
    snap = world.scheduler.snapshot()
    assert (snap.jobs[ok].state, snap.jobs[ok].exit_code) == (JobState.COMPLETED, 0)
    assert (snap.jobs[bad].state, snap.jobs[bad].exit_code) == (JobState.FAILED, 3)
    assert not snap.jobs[ok].held and not snap.jobs[bad].held


def test_cancel_running_then_again_and_finished(world: World) -> None:
    job = world.submit_running(world.request("contract-cancel"))
    done = world.scheduler.submit(world.request("contract-done", seconds=0))
    world.scheduler.cancel(job.job_id)
    cancelled = world.wait_job(job.job_id, over, "cancelled", timeout=10)
    assert cancelled.state is JobState.CANCELLED and cancelled.term_signal == 15
    world.scheduler.cancel(job.job_id)  # already ended: not an error
    world.wait_job(done, over, "finished", timeout=10)
    world.scheduler.cancel(done)  # finished by itself: not an error, and it stays COMPLETED
    assert world.job(done).state is JobState.COMPLETED
    assert world.job(job.job_id).state is JobState.CANCELLED
    world.wait_node(job.nodes[0], lambda n: n.idle, "idle after the cancel", timeout=10)


def test_cancel_of_an_unknown_or_purged_job_is_not_an_error(world: World) -> None:
    # Like scancel (22.05 exits 0 for an id it does not know): a job purged after MinJobAge has
    # ended, and the engine's cancel must be idempotent across that.
    world.scheduler.cancel(UNKNOWN_JOB)
    assert UNKNOWN_JOB not in world.scheduler.snapshot().jobs


def test_changes_to_an_unknown_job_are_permanent(world: World) -> None:
    calls: list[tuple[str, Callable[[], object]]] = [
        ("set_excluded", lambda: world.scheduler.set_excluded(UNKNOWN_JOB, [world.nodes[0]])),
        ("hold", lambda: world.scheduler.hold(UNKNOWN_JOB)),
        ("release", lambda: world.scheduler.release(UNKNOWN_JOB)),
        ("requeue", lambda: world.scheduler.requeue(UNKNOWN_JOB)),
    ]
    for what, call in calls:
        with pytest.raises(PermanentError):
            call()
            pytest.fail(f"{what} of an unknown job was accepted")


# ---------------------------------------------------------------------------- pending jobs


def test_set_excluded_replaces_pending_list_and_is_refused_when_running(world: World) -> None:
    a, b, c, d = world.nodes
    blocker, job = world.pending_behind_blocker("contract-exc", exclude=(b,))
    assert job.excluded_nodes == (b,) and job.nodes == ()
    world.scheduler.set_excluded(job.job_id, [c, a])
    assert set(world.job(job.job_id).excluded_nodes) == {a, c}
    assert len(world.job(job.job_id).excluded_nodes) == 2  # replaced, not added to (b is gone)
    with pytest.raises(PermanentError):
        world.scheduler.set_excluded(blocker.job_id, [a])
    assert world.job(blocker.job_id).excluded_nodes == ()
    world.scheduler.cancel(blocker.job_id)
    started = world.wait_job(job.job_id, running, "running once the blocker is gone", timeout=15)
    assert len(started.nodes) == 1 and started.nodes[0] in (b, d)
    assert set(started.excluded_nodes) == {a, c}


def test_set_excluded_to_nothing(world: World) -> None:
    _, job = world.pending_behind_blocker("contract-exc0", exclude=(world.nodes[1],))
    world.scheduler.set_excluded(job.job_id, [])
    assert world.job(job.job_id).excluded_nodes == ()


def test_hold_then_release(world: World) -> None:
    blocker, job = world.pending_behind_blocker("contract-hold")
    assert not job.held
    world.scheduler.hold(job.job_id)
    held = world.job(job.job_id)
    assert held.held and held.state is JobState.PENDING
    world.scheduler.cancel(blocker.job_id)
    world.wait_job(blocker.job_id, over, "cancelled", timeout=10)
    world.sleep(2)  # free nodes, but held: it must not start
    still = world.job(job.job_id)
    assert still.state is JobState.PENDING and still.held
    world.scheduler.release(job.job_id)
    assert not world.job(job.job_id).held
    started = world.wait_job(job.job_id, running, "running after release", timeout=15)
    assert not started.held and len(started.nodes) == 1


# ---------------------------------------------------------------------------- requeue


def test_requeue_running_job_runs_again(world: World) -> None:
    job = world.submit_running(world.request("contract-requeue", requeue=True))
    world.scheduler.requeue(job.job_id)
    # Real Slurm shows the job COMPLETING (restart_count already 1) for a moment before PENDING.
    requeued = world.wait_job(job.job_id, lambda j: j.restart_count == 1, "requeued", timeout=5)
    assert not requeued.state.finished and not requeued.held
    pending = world.wait_job(job.job_id, lambda j: j.state is JobState.PENDING, "pending", timeout=5)
    assert pending.restart_count == 1 and pending.nodes == () and not pending.held
    again = world.wait_job(job.job_id, running, "running again", timeout=30)
    assert again.restart_count == 1 and len(again.nodes) == 1
    assert again.start_time is not None and job.start_time is not None
    assert again.start_time > job.start_time


# ---------------------------------------------------------------------------- node changes


def test_drain_keeps_job_running_and_resume_makes_node_schedulable(world: World) -> None:
    job = world.submit_running(world.request("contract-drain"))
    node = job.nodes[0]
    reason = "contract: drain test, ecc errors"
    world.scheduler.set_node_state(node, NodeChange.DRAIN, reason)
    drained = world.node(node)
    assert drained.drained and drained.reason == reason and not drained.schedulable
    assert drained.state is not NodeState.DOWN
    world.sleep(1)
    assert world.job(job.job_id).state is JobState.RUNNING
    assert world.job(job.job_id).nodes == (node,)
    # A job needing every node cannot start while one is drained ...
    whole = world.scheduler.submit(world.request("contract-drain-all", len(world.nodes)))
    world.scheduler.cancel(job.job_id)
    world.wait_job(job.job_id, over, "cancelled", timeout=10)
    world.sleep(2)
    assert world.job(whole).state is JobState.PENDING
    assert world.node(node).drained
    # ... and starts once it is resumed.
    world.scheduler.set_node_state(node, NodeChange.RESUME, "")
    back = world.wait_node(node, lambda n: n.schedulable, "schedulable again", timeout=15)
    assert not back.drained and back.reason == ""
    started = world.wait_job(whole, running, "running on every node", timeout=15)
    assert sorted(started.nodes) == sorted(world.nodes)


def test_down_ends_non_requeueable_job_node_fail(world: World) -> None:
    job = world.submit_running(world.request("contract-down", requeue=False))
    node = job.nodes[0]
    world.scheduler.set_node_state(node, NodeChange.DOWN, "contract: down test")
    ended = world.wait_job(job.job_id, over, "ended", timeout=5)
    assert ended.state is JobState.NODE_FAIL and ended.restart_count == 0
    down = world.node(node)
    assert down.down and down.reason == "contract: down test" and not down.schedulable


def test_down_requeues_requeueable_job(world: World) -> None:
    job = world.submit_running(world.request("contract-down-rq", requeue=True))
    node = job.nodes[0]
    world.scheduler.set_node_state(node, NodeChange.DOWN, "contract: down test")
    requeued = world.wait_job(job.job_id, lambda j: j.restart_count == 1 and not j.completing, "requeued", timeout=5)
    assert requeued.state is JobState.PENDING and requeued.nodes == () and not requeued.held
    down = world.node(node)
    assert down.down and down.reason == "contract: down test"


def test_crashed_node_not_responding_then_down_and_job_requeued(world: World) -> None:
    """SlurmCli against a real crash (the slurm side) is checked here only: ~20 s of Slurm's own
    SlurmdTimeout, not worth paying twice (tests/slurm/test_slurm_cli.py had the same case)."""
    job = world.submit_running(world.request("contract-crash", requeue=True))
    node = job.nodes[0]
    world.crash_node(node)
    crashed_at = world.now()
    assert world.node(node).responding  # Slurm does not know yet
    silent = world.wait_node(node, lambda n: not n.responding, "NOT_RESPONDING", timeout=15)
    noticed_after = world.now() - crashed_at
    assert 5 <= noticed_after <= 15, noticed_after
    assert not silent.schedulable
    down = world.wait_node(node, lambda n: n.down, "DOWN", timeout=30)
    assert not down.responding and not down.schedulable and down.reason == "Not responding"
    requeued = world.wait_job(job.job_id, lambda j: j.restart_count == 1 and not j.completing, "requeued", timeout=5)
    assert requeued.state in (JobState.PENDING, JobState.RUNNING) and not requeued.held
    assert node not in requeued.nodes


def test_snapshot_without_nodes_still_has_every_job(world: World) -> None:
    job_id = world.scheduler.submit(world.request("contract-jobs-only", 1))
    snap = world.scheduler.snapshot(include_nodes=False)
    assert job_id in snap.jobs and snap.jobs[job_id].name == "contract-jobs-only"
    assert dict(snap.nodes) == {}
