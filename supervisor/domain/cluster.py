"""What the supervisor observes of the cluster: jobs and nodes, as plain frozen values.

Adapters (the Slurm CLI, the simulated cluster) translate their native shapes into these; the
engine and the domain never see Slurm's JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class JobState(StrEnum):
    """Slurm's base job states (squeue's ``job_state`` without flags)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETING = "COMPLETING"  # only when Slurm reports it as the base state
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    UNKNOWN = "UNKNOWN"

    @property
    def finished(self) -> bool:
        return self in _FINISHED

    @classmethod
    def parse(cls, text: str) -> JobState:
        try:
            return cls(text.upper())
        except ValueError:
            return cls.UNKNOWN


_FINISHED = frozenset(
    {
        JobState.COMPLETED,
        JobState.CANCELLED,
        JobState.FAILED,
        JobState.TIMEOUT,
        JobState.NODE_FAIL,
        JobState.PREEMPTED,
        JobState.BOOT_FAIL,
        JobState.DEADLINE,
        JobState.OUT_OF_MEMORY,
    }
)


class JobHold(StrEnum):
    """Who holds a pending job, as the adapter reads it from the scheduler's own wording.

    Decisions read this, never the scheduler's reason texts: Slurm 22.05 gives a prolog failure's
    hold the same ``state_reason`` as a person's (JobHeldUser) and tells them apart only in a
    free-text description, which the adapter alone interprets.
    """

    NONE = "NONE"  # not held
    USER = "USER"  # held by its owner (JobHeldUser without a launch failure): theirs to release
    ADMIN = "ADMIN"  # held by an administrator (JobHeldAdmin), or left so by a prolog racing a drain
    LAUNCH_FAILED = "LAUNCH_FAILED"  # Slurm held it itself after a failed launch (a prolog error)
    OTHER = "OTHER"  # held some other way (REQUEUE_HOLD, SPECIAL_EXIT, priority 0, ...)


@dataclass(frozen=True)
class Canceller:
    """Who cancelled a job, as Slurm's accounting names them (sacct: "CANCELLED by 1001"): a UID,
    and its account name on the daemon's host ("" when that host does not know it)."""

    uid: int
    name: str = ""

    def __str__(self) -> str:
        return f"{self.name} (uid {self.uid})" if self.name else f"uid {self.uid}"

    @property
    def actor(self) -> str:
        """How the logbook's actor column names them."""
        return self.name or f"uid {self.uid}"


@dataclass(frozen=True)
class JobInfo:
    """One Slurm job as seen in one snapshot.

    ``flags`` holds Slurm's state flags (COMPLETING, REQUEUED, ...), upper case.
    ``exit_code`` is the decoded process exit status (not the raw wait status), None when unknown
    or when the job was killed by a signal (then ``term_signal`` is set).
    ``hold`` says who holds it; ``state_reason``/``state_description`` keep Slurm's own words for
    the logbook, and no decision reads them.
    """

    job_id: int
    name: str
    state: JobState
    flags: frozenset[str] = frozenset()
    restart_count: int = 0
    nodes: tuple[str, ...] = ()
    excluded_nodes: tuple[str, ...] = ()
    exit_code: int | None = None
    term_signal: int | None = None
    state_reason: str = ""
    comment: str = ""
    partition: str = ""
    hold: JobHold = JobHold.NONE
    submit_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None
    # Slurm's free-text detail for the reason, e.g. "launch failed requeued held" while
    # state_reason says JobHeldUser (what ``hold`` is read from). Empty when Slurm gives none.
    state_description: str = ""
    # Who owns the job (numeric UID; None when Slurm did not say) and where its standard output
    # goes as Slurm resolved it (``%j`` and friends expanded by Slurm 22.05+; "" when not given).
    user_id: int | None = None
    stdout: str = ""
    # Who cancelled it, when accounting names them (squeue and scontrol never do): read only when
    # a followed job is found cancelled outside the supervisor. None: not cancelled, or not named.
    cancelled_by: Canceller | None = None
    # When Slurm began preempting the running job (PreemptTime): it runs out its GraceTime, then is
    # requeued or ended. None: not being preempted.
    preempt_time: float | None = None

    @property
    def held(self) -> bool:
        return self.hold is not JobHold.NONE

    @property
    def completing(self) -> bool:
        return self.state is JobState.COMPLETING or "COMPLETING" in self.flags


class NodeState(StrEnum):
    """Slurm's base node states (sinfo's ``state`` without flags)."""

    IDLE = "IDLE"
    ALLOCATED = "ALLOCATED"
    MIXED = "MIXED"
    DOWN = "DOWN"
    ERROR = "ERROR"
    FUTURE = "FUTURE"
    UNKNOWN = "UNKNOWN"

    @classmethod
    def parse(cls, text: str) -> NodeState:
        try:
            return cls(text.upper())
        except ValueError:
            return cls.UNKNOWN


@dataclass(frozen=True)
class NodeInfo:
    """One node as seen in one snapshot. ``flags``: DRAIN, NOT_RESPONDING, COMPLETING, ...

    ``reason`` is the scheduler's free text, kept for the logbook; ``prolog_failed`` is what the
    adapter read from it (22.05: "Prolog error"), so that decisions never parse that text.
    """

    name: str
    state: NodeState
    flags: frozenset[str] = frozenset()
    reason: str = ""
    partitions: tuple[str, ...] = ()
    address: str = ""
    port: int | None = None
    # The scheduler took the node out itself because a job's prolog failed there.
    prolog_failed: bool = False

    @property
    def responding(self) -> bool:
        return "NOT_RESPONDING" not in self.flags

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags or "DRAINED" in self.flags or "DRAINING" in self.flags

    @property
    def down(self) -> bool:
        return self.state is NodeState.DOWN

    @property
    def schedulable(self) -> bool:
        """Could Slurm start a new job here (ignoring what already runs on it)?"""
        return (
            self.responding
            and not self.drained
            and self.state in (NodeState.IDLE, NodeState.ALLOCATED, NodeState.MIXED)
            and "MAINTENANCE" not in self.flags
            and "RESERVED" not in self.flags
        )

    @property
    def idle(self) -> bool:
        """Takes a job now: in service, IDLE, and not still completing an ended job (Slurm starts
        nothing there until the completion is done — tens of seconds after a node of the job hung)."""
        return self.schedulable and self.state is NodeState.IDLE and "COMPLETING" not in self.flags


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything one tick observed, taken at ``taken_at`` (seconds since the epoch, UTC)."""

    taken_at: float
    jobs: Mapping[int, JobInfo] = field(default_factory=dict)
    nodes: Mapping[str, NodeInfo] = field(default_factory=dict)

    def partition_nodes(self, partition: str) -> list[NodeInfo]:
        """The nodes of ``partition`` — or of any of them, for a list like sbatch's ``-p a,b``."""
        wanted = {p.strip() for p in partition.split(",") if p.strip()}
        return [n for n in self.nodes.values() if wanted & set(n.partitions)]

    def jobs_with_comment(self, comment: str) -> list[JobInfo]:
        return [j for j in self.jobs.values() if j.comment == comment]


@dataclass(frozen=True)
class SubmitRequest:
    """One batch submission. The adapter turns it into an sbatch argv (never a shell string).

    ``comment`` carries the supervisor's tag for this submission (run, intent id and a random
    nonce: engine.act.intents) so that a restarted daemon can find a job it submitted but did not live
    to record. ``env`` is for the job only: the adapter hands it to the job, never to the client
    it runs to submit it.
    """

    run: str
    script: str
    job_name: str
    partition: str
    nodes: int
    comment: str
    exclude: tuple[str, ...] = ()
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    output: str | None = None
    workdir: str | None = None
    requeue: bool = False


class NodeChange(StrEnum):
    DRAIN = "DRAIN"
    DOWN = "DOWN"
    RESUME = "RESUME"
