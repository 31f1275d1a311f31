"""The simulated cluster's mutable records, and the frozen values it hands out.

``SimNode``/``SimJob``/``Execution`` are internal and mutable; ``info()`` turns them into the
domain's frozen ``NodeInfo``/``JobInfo``; ``Incarnation`` is the frozen view of one execution.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import ClassVar

from supervisor.domain.cluster import JobHold, JobInfo, JobState, NodeInfo, NodeState, SubmitRequest
from supervisor.sim.clock import Timer

#: Environment variables of a SubmitRequest that steer the simulated job.
ENV_DURATION = "SIM_DURATION"
ENV_EXIT_CODE = "SIM_EXIT_CODE"

REASON_NOT_RESPONDING = "Not responding"
REASON_PROLOG = "Prolog error"
HELD_USER = "JobHeldUser"
HELD_LAUNCH_FAILED = "launch_failed_requeued_held"
# What the simulated Slurm's hold reasons mean, as the real adapter reads Slurm's.
_HOLDS = {HELD_USER: JobHold.USER, HELD_LAUNCH_FAILED: JobHold.LAUNCH_FAILED}


@dataclass(frozen=True)
class Incarnation:
    """One run of a job's batch script: ``(job_id, restart_count)`` on ``nodes``.

    ``start`` is when it was launched; ``end`` is when its last process stopped (None while any
    still runs anywhere, including on a node whose slurmd is dead).
    """

    job_id: int
    restart_count: int
    nodes: tuple[str, ...]
    start: float
    end: float | None

    def overlaps(self, other: Incarnation) -> bool:
        """Did both execute at the same moment (a positive-length overlap)?"""
        self_end = float("inf") if self.end is None else self.end
        other_end = float("inf") if other.end is None else other.end
        return self.start < other_end and other.start < self_end


@dataclass(eq=False)
class Execution:
    """Mutable record of one incarnation; ``live`` holds the nodes where its processes run."""

    job_id: int
    restart_count: int
    nodes: tuple[str, ...]
    start: float
    end: float | None = None
    live: set[str] = field(default_factory=set)

    @property
    def key(self) -> tuple[int, int]:
        return (self.job_id, self.restart_count)

    def freeze(self) -> Incarnation:
        return Incarnation(self.job_id, self.restart_count, self.nodes, self.start, self.end)


@dataclass(eq=False)
class SimNode:
    """One node. ``slurmd_up`` is the truth; ``not_responding``/``down`` are what Slurm shows."""

    name: str
    partition: str
    slurmd_up: bool = True
    frozen: bool = False
    not_responding: bool = False
    down: bool = False
    down_auto: bool = False  # DOWN because it stopped responding (ReturnToService=1 undoes it)
    drain: bool = False
    reason: str = ""
    job: int | None = None
    prolog_fails: bool = False
    procs: set[Execution] = field(default_factory=set)
    timers: list[Timer] = field(default_factory=list)
    _info: NodeInfo | None = field(default=None, repr=False, compare=False)
    # The node's NodeInfo per distinct state: a node going IDLE <-> ALLOCATED reuses them.
    _seen: dict[tuple[bool, bool, bool, bool, str], NodeInfo] = field(default_factory=dict, repr=False)

    #: Bumped by any change of any node: a snapshot reuses its node map while it is unchanged.
    changes: ClassVar[int] = 0

    def __setattr__(self, name: str, value: object) -> None:
        # Any change of a field drops the cached NodeInfo: snapshots of thousands of nodes then
        # rebuild only the nodes that changed since the last one.
        object.__setattr__(self, name, value)
        if name != "_info":
            object.__setattr__(self, "_info", None)
            SimNode.changes += 1

    @property
    def free(self) -> bool:
        """Would Slurm's scheduler put a new job here?"""
        return self.job is None and not self.down and not self.drain and not self.not_responding

    def cancel_timers(self) -> None:
        for timer in self.timers:
            timer.cancel()
        self.timers.clear()

    def info(self) -> NodeInfo:
        info = self._info
        if info is None:
            key = (self.down, self.job is None, self.drain, self.not_responding, self.reason)
            info = self._seen.get(key)
            if info is None:
                info = self._seen[key] = self._build_info()
            object.__setattr__(self, "_info", info)
        return info

    def _build_info(self) -> NodeInfo:
        if self.down:
            state = NodeState.DOWN
        elif self.job is not None:
            state = NodeState.ALLOCATED
        else:
            state = NodeState.IDLE
        flags: set[str] = set()
        if self.drain:
            flags.add("DRAIN")
        if self.not_responding:
            flags.add("NOT_RESPONDING")
        return NodeInfo(
            name=self.name,
            state=state,
            flags=frozenset(flags),
            reason=self.reason,
            partitions=(self.partition,),
            address=self.name,
            prolog_failed=self.reason == REASON_PROLOG,
        )


@dataclass(eq=False)
class SimJob:
    job_id: int
    request: SubmitRequest
    submit_time: float
    excluded: tuple[str, ...]
    state: JobState = JobState.PENDING
    restart_count: int = 0
    nodes: tuple[str, ...] = ()
    held: bool = False
    hold_reason: str = HELD_USER
    begin_time: float = 0.0
    queue_wait: float = 0.0  # its wait to reach the head of the queue (sim.training.chain)
    queued_at: float | None = None  # when that wait began (None: held since its submission)
    eligible_at: float = 0.0  # queued_at + queue_wait
    start_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None
    term_signal: int | None = None
    reason: str = "None"
    execution: Execution | None = None
    purge_timer: Timer | None = None
    preempt_time: float | None = None  # a preemption began (its GraceTime runs): SimCluster.begin_preemption

    @property
    def requeueable(self) -> bool:
        return self.request.requeue

    @property
    def no_kill(self) -> bool:
        """Submitted with ``sbatch --no-kill`` (``-k``): a failed node leaves, the job runs on."""
        return any(arg in ("--no-kill", "-k", "--no-kill=on") for arg in self.request.extra_args)

    @property
    def after_job(self) -> int | None:
        """The job of ``--dependency=afterany:ID``, when submitted with one."""
        for arg in self.request.extra_args:
            if arg.startswith("--dependency=afterany:"):
                return int(arg.rsplit(":", 1)[1])
        return None

    @property
    def duration(self) -> float | None:
        text = self.request.env.get(ENV_DURATION)
        return None if text is None else float(text)

    @property
    def planned_exit_code(self) -> int:
        return int(self.request.env.get(ENV_EXIT_CODE, "0"))

    def info(self) -> JobInfo:
        finished = self.state.finished
        return JobInfo(
            job_id=self.job_id,
            name=self.request.job_name,
            state=self.state,
            restart_count=self.restart_count,
            nodes=self.nodes,
            excluded_nodes=self.excluded,
            exit_code=self.exit_code,
            term_signal=self.term_signal,
            state_reason=self.reason,
            comment=self.request.comment,
            partition=self.request.partition,
            hold=_HOLDS.get(self.hold_reason, JobHold.OTHER) if self.held and not finished else JobHold.NONE,
            submit_time=self.submit_time,
            start_time=self.start_time,
            end_time=self.end_time,
            user_id=os.getuid(),  # the simulated Slurm runs every job as the daemon's user
            preempt_time=None if self.state is JobState.PENDING else self.preempt_time,
        )
