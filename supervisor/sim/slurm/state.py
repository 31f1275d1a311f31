"""The simulated controller and nodes: state transitions, scheduling and timed events.

No validation and no call log here (that is ``SimCluster``'s job): every method assumes its
arguments are valid. Transitions never run the scheduler themselves; callers (the public methods
of ``SimCluster`` and the timed events below) call ``schedule()`` once they are done.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from supervisor.domain.cluster import JobState, SubmitRequest
from supervisor.sim.clock import VirtualClock
from supervisor.sim.slurm.records import (
    HELD_LAUNCH_FAILED,
    HELD_USER,
    REASON_NOT_RESPONDING,
    REASON_PROLOG,
    Execution,
    Incarnation,
    SimJob,
    SimNode,
)

IncarnationListener = Callable[[str, Incarnation], None]


class ClusterState:
    def __init__(
        self,
        clock: VirtualClock,
        names: Sequence[str],
        partition: str,
        *,
        slurmd_timeout: float,
        down_after: float,
        cred_expire: float,
        min_job_age: float,
        first_job_id: int,
        queue_wait: Callable[[], float] | None = None,
        accrue_always: bool = True,
    ) -> None:
        self.clock = clock
        self.slurmd_timeout = slurmd_timeout
        self.down_after = down_after
        self.cred_expire = cred_expire
        self.min_job_age = min_job_age
        self.nodes: dict[str, SimNode] = {n: SimNode(n, partition) for n in names}
        self.partitions: dict[str, list[SimNode]] = {partition: list(self.nodes.values())}
        self.jobs: dict[int, SimJob] = {}
        self.pending: dict[int, SimJob] = {}
        self.executions: list[Execution] = []
        self.listeners: list[IncarnationListener] = []
        self._ids = itertools.count(first_job_id)
        # Each job entering the queue waits this long before it may start (sim.training.chain); a held
        # job's wait counts from its submission only with PriorityFlags=ACCRUE_ALWAYS.
        self.queue_wait = queue_wait
        self.accrue_always = accrue_always

    # -- jobs -----------------------------------------------------------------------------------

    def submit(self, request: SubmitRequest) -> SimJob:
        order = {name: i for i, name in enumerate(self.nodes)}
        excluded = tuple(sorted(set(request.exclude), key=lambda n: order.get(n, len(order))))
        job = SimJob(next(self._ids), request, self.clock.now(), excluded)
        job.held = "--hold" in request.extra_args  # sbatch --hold: a user hold until released
        job.queue_wait = self.queue_wait() if self.queue_wait is not None else 0.0
        if not job.held or self.accrue_always:
            self._wait_in_queue(job)
        self.jobs[job.job_id] = job
        self.pending[job.job_id] = job
        return job

    def _wait_in_queue(self, job: SimJob) -> None:
        """From now, the job needs its queue wait to reach the head of the queue."""
        job.queued_at = self.clock.now()
        job.eligible_at = job.queued_at + job.queue_wait
        if job.queue_wait > 0:
            self.clock.call_at(job.eligible_at, self.schedule)

    def schedule(self) -> None:
        """FIFO by job id per partition: a job that does not fit blocks later ones (builtin)."""
        if not self.pending:
            return
        now = self.clock.now()
        blocked: set[str] = set()
        for job_id in sorted(self.pending):
            job = self.pending.get(job_id)
            if job is None:
                continue
            if job.held:
                job.reason = job.hold_reason
            elif self._waits_on_dependency(job):
                job.reason = "Dependency"
            elif job.begin_time > now:
                job.reason = "BeginTime"
            elif job.eligible_at > now:
                job.reason = "Priority"  # other jobs are ahead of it in the queue
            elif job.request.partition in blocked:
                job.reason = "Priority"
            else:
                chosen = self._pick(job)
                if chosen is None:
                    blocked.add(job.request.partition)
                    job.reason = "Resources"
                else:
                    self._start(job, chosen)

    def _waits_on_dependency(self, job: SimJob) -> bool:
        """``--dependency=afterany:ID``: not before that job has ended (and left its nodes)."""
        after = job.after_job
        other = self.jobs.get(after) if after is not None else None
        return other is not None and (
            not other.state.finished or any(n.job == other.job_id for n in self.nodes.values())
        )

    def _pick(self, job: SimJob) -> tuple[str, ...] | None:
        need = job.request.nodes
        excluded = set(job.excluded)
        chosen: list[str] = []
        for node in self.partitions.get(job.request.partition, ()):
            if node.free and node.name not in excluded:
                chosen.append(node.name)
                if len(chosen) == need:
                    return tuple(chosen)
        return None

    def _start(self, job: SimJob, names: tuple[str, ...]) -> None:
        del self.pending[job.job_id]
        job.state = JobState.RUNNING
        job.nodes = names
        job.start_time = self.clock.now()
        job.end_time = None
        job.exit_code = None
        job.term_signal = None
        job.reason = "None"
        for name in names:
            self.nodes[name].job = job.job_id
        failing = [n for n in names if self.nodes[n].prolog_fails and self.nodes[n].slurmd_up]
        if failing:
            self._prolog_failed(job, failing)
            return
        self._launch(job, names)

    def _launch(self, job: SimJob, names: tuple[str, ...]) -> None:
        exe = Execution(job.job_id, job.restart_count, names, self.clock.now())
        exe.live = {n for n in names if self.nodes[n].slurmd_up}
        for name in exe.live:
            self.nodes[name].procs.add(exe)
        job.execution = exe
        self.executions.append(exe)
        self._notify("start", exe)
        if not exe.live:
            self._ended(exe)
        duration = job.duration
        if duration is not None:
            self.clock.call_later(duration, self.script_exit, job, exe, job.planned_exit_code)

    def _prolog_failed(self, job: SimJob, failing: list[str]) -> None:
        for name in failing:
            node = self.nodes[name]
            node.drain = True
            node.reason = REASON_PROLOG
        if job.requeueable:
            self.requeue(job, hold=True, hold_reason=HELD_LAUNCH_FAILED)
        else:
            self.finish(job, JobState.NODE_FAIL, reason="Prolog")

    def script_exit(self, job: SimJob, exe: Execution, exit_code: int) -> None:
        """The batch script of ``exe`` exits by itself (timed by SIM_DURATION, or finish_job)."""
        batch = exe.nodes[0]
        if exe.end is not None or batch not in exe.live:
            return  # already killed
        if job.execution is not exe or not self.nodes[batch].slurmd_up:
            # A stale copy, or slurmd is dead so Slurm never hears of it: the processes just go.
            self._kill(exe, everywhere=True)
            return
        state = JobState.COMPLETED if exit_code == 0 else JobState.FAILED
        reason = "None" if exit_code == 0 else "NonZeroExitCode"
        self.finish(job, state, exit_code=exit_code, reason=reason, everywhere=True)
        self.schedule()

    def finish(
        self,
        job: SimJob,
        state: JobState,
        *,
        exit_code: int | None = None,
        term_signal: int | None = None,
        reason: str = "None",
        everywhere: bool = False,
    ) -> None:
        if job.state is JobState.RUNNING:
            self._release(job, everywhere=everywhere)
        self.pending.pop(job.job_id, None)
        job.state = state
        job.end_time = self.clock.now()
        job.exit_code = exit_code
        job.term_signal = term_signal
        job.reason = reason
        job.purge_timer = self.clock.call_background(self.clock.now() + self.min_job_age, self._purge, job)

    def requeue(self, job: SimJob, *, hold: bool = False, hold_reason: str = HELD_USER) -> None:
        """Back to PENDING with restart_count+1; startable again after ``cred_expire``."""
        if job.state is JobState.RUNNING:
            self._release(job, everywhere=False)
        if job.purge_timer is not None:
            job.purge_timer.cancel()
            job.purge_timer = None
        job.restart_count += 1
        job.preempt_time = None
        job.state = JobState.PENDING
        job.nodes = ()
        job.start_time = job.end_time = None
        job.exit_code = job.term_signal = None
        job.begin_time = self.clock.now() + self.cred_expire
        if self.queue_wait is not None:  # back in the queue: behind the jobs there
            job.queue_wait = self.queue_wait()
            self._wait_in_queue(job)
        if hold:
            self.set_held(job, True, hold_reason)
        job.reason = job.hold_reason if job.held else "BeginTime"
        self.pending[job.job_id] = job
        self.clock.call_at(job.begin_time, self.schedule)

    def set_held(self, job: SimJob, held: bool, hold_reason: str = HELD_USER) -> None:
        if not held and job.queued_at is None and job.state is JobState.PENDING:
            self._wait_in_queue(job)  # held since its submission, without ACCRUE_ALWAYS: its wait starts now
        job.held = held
        job.hold_reason = hold_reason if held else HELD_USER
        if job.state is JobState.PENDING and held:
            job.reason = hold_reason

    def fail_on_node(self, job: SimJob, node: SimNode | None = None) -> None:
        """A node of the job failed: requeue it if it may be, else it ends NODE_FAIL — unless the
        job was submitted with ``--no-kill``: then the node only leaves its allocation."""
        if node is not None and job.no_kill and job.state is JobState.RUNNING and len(job.nodes) > 1:
            self.shrink(job, node)
        elif job.requeueable:
            self.requeue(job)
        else:
            self.finish(job, JobState.NODE_FAIL, reason="NodeDown")

    def shrink(self, job: SimJob, node: SimNode) -> None:
        """``--no-kill``: the node leaves the job's NodeList (NumNodes shrinks), its processes of
        the job are gone, the job runs on — even when it was the batch host (measured on 22.05:
        docs/in-allocation.md)."""
        job.nodes = tuple(n for n in job.nodes if n != node.name)
        node.job = None
        exe = job.execution
        if exe is not None and node.name in exe.live:
            exe.live.discard(node.name)
            node.procs.discard(exe)
            if not exe.live:
                self._ended(exe)

    def _release(self, job: SimJob, *, everywhere: bool) -> None:
        if job.execution is not None:
            self._kill(job.execution, everywhere=everywhere)
            job.execution = None
        for name in job.nodes:
            node = self.nodes[name]
            if node.job == job.job_id:
                node.job = None

    def _kill(self, exe: Execution, *, everywhere: bool) -> None:
        """Stop ``exe``'s processes; without ``everywhere`` those behind a dead slurmd survive."""
        for name in list(exe.live):
            node = self.nodes[name]
            if everywhere or node.slurmd_up:
                exe.live.discard(name)
                node.procs.discard(exe)
        if not exe.live:
            self._ended(exe)

    def _ended(self, exe: Execution) -> None:
        if exe.end is None:
            exe.end = self.clock.now()
            self._notify("end", exe)

    def _purge(self, job: SimJob) -> None:
        if job.state.finished and self.jobs.get(job.job_id) is job:
            del self.jobs[job.job_id]

    def _notify(self, kind: str, exe: Execution) -> None:
        if self.listeners:
            value = exe.freeze()
            for listener in list(self.listeners):
                listener(kind, value)

    # -- nodes ----------------------------------------------------------------------------------

    def crash(self, node: SimNode) -> None:
        """slurmd and every process on the node die now."""
        was_up = node.slurmd_up
        node.slurmd_up = False
        node.frozen = False
        for exe in list(node.procs):
            exe.live.discard(node.name)
            node.procs.discard(exe)
            if not exe.live:
                self._ended(exe)
        if was_up:
            self._arm_timeouts(node)

    def freeze(self, node: SimNode) -> None:
        """slurmd stops answering; the job processes keep running."""
        if not node.slurmd_up:
            return
        node.slurmd_up = False
        node.frozen = True
        self._arm_timeouts(node)

    def restore(self, node: SimNode) -> None:
        """slurmd is back and registers: stale copies die, ReturnToService=1 applies."""
        if node.slurmd_up:
            return
        node.cancel_timers()
        node.slurmd_up = True
        node.frozen = False
        node.not_responding = False
        for exe in list(node.procs):
            job = self.jobs.get(exe.job_id)
            if job is None or job.execution is not exe:
                exe.live.discard(node.name)
                node.procs.discard(exe)
                if not exe.live:
                    self._ended(exe)
        if node.down and node.down_auto:
            node.down = node.down_auto = False
            if not node.drain:
                node.reason = ""
        if node.job is not None:
            job = self.jobs[node.job]
            if job.execution is None or node.name not in job.execution.live:
                self.fail_on_node(job, node)  # Slurm finds the job missing from the node
        self.schedule()

    def _arm_timeouts(self, node: SimNode) -> None:
        node.cancel_timers()
        node.timers.append(self.clock.call_later(self.slurmd_timeout, self._on_silent, node))
        node.timers.append(self.clock.call_later(self.down_after, self._on_timeout, node))

    def _on_silent(self, node: SimNode) -> None:
        node.not_responding = True

    def _on_timeout(self, node: SimNode) -> None:
        node.not_responding = True
        if not node.down:
            node.down = node.down_auto = True
        if not node.reason:
            node.reason = REASON_NOT_RESPONDING
        if node.job is not None:
            self.fail_on_node(self.jobs[node.job], node)
        self.schedule()

    def drain(self, node: SimNode, reason: str) -> None:
        node.drain = True
        node.reason = reason

    def set_down(self, node: SimNode, reason: str) -> None:
        node.down = True
        node.down_auto = False
        node.reason = reason
        if node.job is not None:
            self.fail_on_node(self.jobs[node.job], node)

    def resume(self, node: SimNode) -> None:
        node.drain = node.down = node.down_auto = False
        node.reason = ""
        if not node.slurmd_up:  # Slurm will find out again that it does not answer
            node.cancel_timers()
            delay = max(0.0, self.down_after - self.slurmd_timeout)
            node.timers.append(self.clock.call_later(delay, self._on_timeout, node))
