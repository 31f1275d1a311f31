"""What the supervisor remembers: runs, attempts (incarnations), node verdicts, logbook events."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from supervisor.domain.alloc_step import AllocationStep
from supervisor.domain.progress.hang import HangPace
from supervisor.domain.run import RunSpec, RunState


@dataclass(frozen=True)
class AttemptRecord:
    """One incarnation of a run: a job id plus Slurm's restart count for it.

    ``seq`` numbers a run's attempts 0, 1, 2, ... whatever the job ids; Slurm requeues keep the job
    id and raise ``restart_count``, resubmissions get a new job id with restart_count 0.
    """

    run: str
    seq: int
    job_id: int
    restart_count: int
    submitted_at: float
    nodes: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()
    started_at: float | None = None
    ended_at: float | None = None
    end_state: str | None = None
    end_reason: str | None = None
    exit_code: int | None = None
    last_step: int | None = None  # the newest training step its log showed
    step_time_s: float | None = None  # its step time, as the log showed it
    hang_pace: HangPace | None = None  # what the hang detector learned of its pace
    save_s: float | None = None  # the median time its checkpoint saves stalled its log (read times)
    load_failed: str | None = None  # why its log shows its checkpoint load failed (domain/progress/loads.py)
    failed_before_load: str | None = None  # what its log shows it died of before any load began
    continued_with: str | None = None  # its planned end was continued from this verified checkpoint
    preempted_at: float | None = None  # when Slurm began preempting it (PreemptTime: its GraceTime began)

    @property
    def label(self) -> str:
        return f"attempt {self.seq} (job {self.job_id}, restart {self.restart_count})"


@dataclass(frozen=True)
class Successor:
    """The run's next job, pre-queued before its current one ends (domain.decide.prequeue): held,
    behind ``--dependency=afterany`` on the attempt ``after_seq``'s job; released, as the run's
    next attempt, when that one's planned end is continued, cancelled when it is not."""

    job_id: int
    after_seq: int
    submitted_at: float
    exclude: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunRecord:
    spec: RunSpec
    state: RunState
    restarts_spent: int = 0
    created_at: float = 0.0
    updated_at: float = 0.0
    cancel_requested: bool = False
    end_reason: str | None = None
    attempt: AttemptRecord | None = None  # the current (newest) attempt
    excluded: Mapping[str, str] = field(default_factory=dict)  # node -> why it is kept out
    # node -> (since, why): degraded, kept out from the next restart or checkpoint boundary on
    deferred: Mapping[str, tuple[float, str]] = field(default_factory=dict)
    owner_uid: int | None = None  # who registered it (kernel-given UID); None: the instance's account
    step: AllocationStep | None = None  # in-allocation mode: the current job's step, desired and reported
    successor: Successor | None = None  # the next job, pre-queued (held) before the current one ends

    @property
    def name(self) -> str:
        return self.spec.name


class Verdict(StrEnum):
    HEALTHY = "healthy"
    SUSPECT = "suspect"  # seen failing, not yet confirmed
    BAD = "bad"  # confirmed: kept out of the run (and drained when the supervisor may)


@dataclass(frozen=True)
class NodeVerdict:
    node: str
    verdict: Verdict
    reason: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    run: str | None = None
    # "down", "drained" (by this supervisor), "excluded" (kept out of the run only), "blast-radius",
    # "deferred", "held-by-slurm" (Slurm itself, an admin or a health check took it out of service),
    # "returned" (back in service after that)
    action: str | None = None
    at: float = 0.0


class EventKind(StrEnum):
    REGISTERED = "registered"
    SUBMITTED = "submitted"
    STARTED = "started"
    FAULT = "fault"
    NODE_DRAINED = "node_drained"
    NODE_EXCLUDED = "node_excluded"
    FENCED = "fenced"
    STOPPED = "stopped"  # the supervisor stopped a broken incarnation
    REQUEUED = "requeued"  # Slurm requeued the job by itself
    RESTARTED = "restarted"
    RELEASED = "released"
    COMPLETED = "completed"
    GAVE_UP = "gave_up"
    CANCELLED = "cancelled"
    ADOPTED = "adopted"
    NOTE = "note"
    WARNING = "warning"
    CHECKPOINT_VERIFIED = "checkpoint_verified"
    CHECKPOINT_CORRUPT = "checkpoint_corrupt"
    CHECKPOINT_UNVERIFIABLE = "checkpoint_unverifiable"
    CHECKPOINT_STALE = "checkpoint_stale"  # no verified checkpoint for k expected intervals
    NODE_RETURNED = "node_returned"  # a node this supervisor drained is back in service: usable again
    NODE_CARE = "node_care"  # a rung of the remediation ladder (domain.health.ladder), with its evidence
    SLOWDOWN = "slowdown"  # the job's throughput fell below its own baseline, sustained
    NODE_DEGRADED = "node_degraded"  # kept out from the next restart or checkpoint boundary
    MASS_FAULT = "mass_fault"  # more nodes faulted at once than the blast radius allows: a human decides
    SPIKE = "spike"  # a loss / grad-norm spike, a non-finite loss, a loss-scale collapse began
    SPIKE_HEALED = "spike_healed"  # ... and healed within its window: left alone
    ROLLBACK = "rollback"  # ... did not heal: the run goes back to a verified checkpoint, skipping data
    ROLLBACK_BLOCKED = "rollback_blocked"  # ... did not heal, and the supervisor may not roll back: page
    WAITING_FOR_NODES = "waiting_for_nodes"  # the run cannot be placed: which nodes it waits for, and why
    STUCK = "stuck"  # ... and has waited past the threshold: page
    QUARANTINE_OVERRIDE = "quarantine_override"  # a quarantined node used because the run could not be placed
    BACKOFF = "backoff"  # the next restart waits: attempts keep failing soon after they start
    CONTROLLER_OUTAGE = "controller_outage"  # Slurm's controller did not answer for a while (from, to)
    STORE_OUTAGE = "store_outage"  # the shared store (PostgreSQL) did not answer for a while (from, to)
    CRASH_LOOP = "crash_loop"  # ... so often that each restart waits the crash-loop pause: page
    PREQUEUED = "prequeued"  # the next job submitted held before the current one's limit (decide.prequeue)
    CONTINUED = "continued"  # the job ended on purpose after a verified save: the next one continues it


@dataclass(frozen=True)
class Event:
    """One logbook line. ``key`` makes recording idempotent: the same key is recorded once."""

    run: str
    kind: EventKind
    message: str
    key: str
    at: float = 0.0
    attempt: int | None = None
    job_id: int | None = None
    actor: str = "supervisor"
    evidence: Mapping[str, Any] = field(default_factory=dict)
