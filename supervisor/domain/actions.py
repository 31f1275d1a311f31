"""What a decision asks for: actions on the outside world and records in the store.

Actions are journaled as intents before the engine executes them, so each carries everything
needed to execute it again, and to recognise from Slurm's state that it already took effect.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from supervisor.domain.checkpoints.manifest import CheckpointRef, VerifyResult
from supervisor.domain.checkpoints.resume import ResumePlan
from supervisor.domain.cluster import NodeChange
from supervisor.domain.health.findings import NodeFinding
from supervisor.domain.health.quarantine import Fault
from supervisor.domain.progress.hang import HangPace
from supervisor.domain.records import Event, NodeVerdict, Successor
from supervisor.domain.run import RunState
from supervisor.domain.spikes.rollback import RollbackRecord


class ActionKind(StrEnum):
    SUBMIT = "submit"
    CANCEL = "cancel"
    NODE_STATE = "node_state"
    SET_EXCLUDED = "set_excluded"
    RELEASE = "release"
    FENCE = "fence"
    SWAP_STEP = "swap_step"
    START_SUCCESSOR = "start_successor"


@dataclass(frozen=True)
class Submit:
    """Submit a new incarnation of the run. ``restart`` is True when it replaces a broken one."""

    run: str
    exclude: tuple[str, ...]
    restart: bool
    reason: str
    kind: ActionKind = ActionKind.SUBMIT
    # The checkpoint handed to the job (filled by the engine before the intent is journaled, so a
    # retried submission hands the same one): see domain.checkpoints.resume.
    resume: ResumePlan | None = None
    # The random part of the job's tag, chosen (and journaled) with the intent: engine.act.intents.
    nonce: str = ""
    # In-allocation mode: hot spares the job asks for beyond the run's nodes, as many of the spec's
    # as the usable nodes leave room for (None: the spec's, as journals before it was counted say).
    hot_spares: int | None = None
    # Pre-queued: submitted held behind --dependency=afterany on this job; the run's successor
    # (records.Successor), not yet its attempt. None: an attempt of its own at once.
    after_job: int | None = None


@dataclass(frozen=True)
class Cancel:
    run: str
    job_id: int
    reason: str
    kind: ActionKind = ActionKind.CANCEL


@dataclass(frozen=True)
class ChangeNode:
    run: str
    node: str
    change: NodeChange
    reason: str
    kind: ActionKind = ActionKind.NODE_STATE


@dataclass(frozen=True)
class SetExcluded:
    run: str
    job_id: int
    nodes: tuple[str, ...]
    kind: ActionKind = ActionKind.SET_EXCLUDED


@dataclass(frozen=True)
class Release:
    run: str
    job_id: int
    reason: str
    kind: ActionKind = ActionKind.RELEASE


@dataclass(frozen=True)
class StartSuccessor:
    """Make the pre-queued successor the run's next attempt: its exclude list made current, the
    resume file rewritten (the checkpoint as of its start), its hold released."""

    run: str
    job_id: int
    exclude: tuple[str, ...]
    reason: str
    kind: ActionKind = ActionKind.START_SUCCESSOR
    resume: ResumePlan | None = None  # filled by the engine before the intent is journaled


@dataclass(frozen=True)
class SuccessorSet:
    """The run's next job is pre-queued: on record (``RunRecord.successor``)."""

    run: str
    successor: Successor


@dataclass(frozen=True)
class SuccessorDropped:
    """The pre-queued successor is gone (cancelled, or never to start): off the record."""

    run: str
    job_id: int


@dataclass(frozen=True)
class Fence:
    """Make sure nothing of the old incarnation still runs on ``node`` (site fence command)."""

    run: str
    node: str
    job_id: int
    kind: ActionKind = ActionKind.FENCE


@dataclass(frozen=True)
class SwapStep:
    """In-allocation recovery: the job's step becomes generation ``generation`` on ``nodes`` (``out``
    replaced by the hot spares ``into``; neither for a relaunch in place). Performing it writes the step goal the launcher converges
    on; the engine fills ``resume`` before journaling, as for a submission."""

    run: str
    job_id: int
    generation: int
    nodes: tuple[str, ...]
    out: tuple[str, ...]
    into: tuple[str, ...]
    reason: str
    kind: ActionKind = ActionKind.SWAP_STEP
    resume: ResumePlan | None = None
    restart: bool = False  # a relaunch in place after a failure of the step: one restart spent


Action = Submit | Cancel | ChangeNode | SetExcluded | Release | Fence | SwapStep | StartSuccessor


@dataclass(frozen=True)
class AttemptStarted:
    run: str
    seq: int
    nodes: tuple[str, ...]
    at: float


@dataclass(frozen=True)
class AttemptEnded:
    run: str
    seq: int
    at: float
    end_state: str
    reason: str
    exit_code: int | None = None


@dataclass(frozen=True)
class AttemptContinued:
    """The attempt ended on purpose after a verified save: continued from ``checkpoint`` (no
    restart spent). Read back to bound a chain that continues without saving anew."""

    run: str
    seq: int
    checkpoint: str


@dataclass(frozen=True)
class AttemptPreempted:
    """Slurm began preempting the running attempt at ``at`` (a higher-priority job wants its nodes;
    the GraceTime's SIGTERM is the trainer's to save on). Read back when the job ends or is requeued."""

    run: str
    seq: int
    at: float


@dataclass(frozen=True)
class AttemptRequeued:
    """Slurm requeued the job itself: a new attempt with the same job id."""

    run: str
    job_id: int
    restart_count: int
    at: float
    excluded: tuple[str, ...]


@dataclass(frozen=True)
class Exclude:
    run: str
    node: str
    reason: str


@dataclass(frozen=True)
class Defer:
    """Record: keep a degraded node out of the run from its next restart or checkpoint boundary."""

    run: str
    node: str
    reason: str


@dataclass(frozen=True)
class Unexclude:
    """Record: the node is back in service (someone returned it in Slurm): the run may use it again."""

    run: str
    node: str


@dataclass(frozen=True)
class SetState:
    run: str
    state: RunState
    reason: str | None = None
    spend_restart: bool = False


@dataclass(frozen=True)
class AttemptProgress:
    """What the attempt's log showed last: read back by decisions after a daemon restart."""

    run: str
    seq: int
    last_step: int
    step_time_s: float | None = None
    hang_pace: HangPace | None = None
    save_s: float | None = None  # the median time its checkpoint saves stalled its log


@dataclass(frozen=True)
class AttemptLoadFailed:
    """What the attempt's log shows of a failed checkpoint load (``why``: the error line, or a load
    begun and never finished): the evidence checkpoint fallback reads back (``domain/checkpoints/demotion.py``).
    ``before_load``: ``why`` is what it died of before any load began — the checkpoint is not to
    blame."""

    run: str
    seq: int
    why: str
    before_load: bool = False


@dataclass(frozen=True)
class NodeMark:
    """What was last done to a node, as its verdict's ``action`` ("held-by-slurm": someone other
    than this supervisor took it out of service; it counts as returned once back)."""

    node: str
    action: str


@dataclass(frozen=True)
class ActiveFindings:
    """The node findings the engine holds active now (each node's worst degraded or fatal finding
    not yet acted on or expired): kept in the store, so a restarted daemon holds them too."""

    findings: tuple[NodeFinding, ...]


@dataclass(frozen=True)
class CheckpointSeen:
    """A checkpoint found in the run's storage (new, or changed: its commit marker appeared)."""

    run: str
    ref: CheckpointRef
    at: float


@dataclass(frozen=True)
class CheckpointChecked:
    """What a verification of a checkpoint found."""

    run: str
    result: VerifyResult


@dataclass(frozen=True)
class CheckpointDemoted:
    """A checkpoint passed over from now on, and why (attempts kept failing to resume from it)."""

    run: str
    location: str
    why: str


Record = (
    AttemptStarted
    | AttemptEnded
    | AttemptRequeued
    | AttemptContinued
    | AttemptPreempted
    | SuccessorSet
    | SuccessorDropped
    | Exclude
    | Defer
    | Unexclude
    | SetState
    | Event
    | NodeVerdict
    | Fault
    | RollbackRecord
    | AttemptProgress
    | AttemptLoadFailed
    | NodeMark
    | ActiveFindings
    | CheckpointSeen
    | CheckpointChecked
    | CheckpointDemoted
)


@dataclass(frozen=True)
class Decision:
    """The outcome of deciding for one run on one snapshot: records first, then actions."""

    records: tuple[Record, ...] = ()
    actions: tuple[Action, ...] = ()
    # Decide again at this time although nothing else changes (evidence awaited, a page due): the
    # simulator must not skip past it.
    recheck_at: float | None = None
    # The run cannot be placed and waits for nodes: not a recovery in motion (no urgent ticks),
    # but node state is read every tick so that a node's return is seen at once.
    waiting: bool = False

    def __add__(self, other: Decision) -> Decision:
        times = [t for t in (self.recheck_at, other.recheck_at) if t is not None]
        return Decision(
            self.records + other.records,
            self.actions + other.actions,
            min(times) if times else None,
            self.waiting or other.waiting,
        )
