"""Ports: the small Protocols through which the engine reaches the outside world.

Adapters implement them (Slurm CLI, SQLite, TCP probes, the system clock); the simulator and
unit tests implement them with stateful fakes. Errors cross a port as ``TransientError`` (try
again later; nothing is known to have changed) or ``PermanentError`` (retrying will not help).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from supervisor.domain.alloc_step import LauncherReport, StepGoal
from supervisor.domain.checkpoints.manifest import CheckpointRef, Level, Manifest, VerifyResult
from supervisor.domain.checkpoints.resume import ResumePlan
from supervisor.domain.cluster import ClusterSnapshot, JobInfo, NodeChange, NodeInfo, SubmitRequest
from supervisor.domain.decide.blast import NodeChangeRecord
from supervisor.domain.health.findings import NodeFinding
from supervisor.domain.health.ladder import CareOp, NodeCare, NodeSeen
from supervisor.domain.health.quarantine import Fault, Quarantine
from supervisor.domain.health.validation import ValidationVerdict
from supervisor.domain.lease import Lease
from supervisor.domain.progress.hang import HangPace
from supervisor.domain.progress.series import ProgressPoint
from supervisor.domain.records import AttemptRecord, Event, EventKind, NodeVerdict, RunRecord, Successor
from supervisor.domain.run import RunSpec, RunState
from supervisor.domain.spikes.rollback import RollbackRecord
from supervisor.domain.stacks.dumps import Capture
from supervisor.domain.stacks.verdict import StackVerdict


class PortError(Exception):
    """Base of the errors that cross a port."""


class TransientError(PortError):
    """The outside world did not answer (timeout, controller down). Retry after ``delay``."""

    def __init__(self, message: str, *, delay: float = 1.0) -> None:
        super().__init__(message)
        self.delay = delay


class PermanentError(PortError):
    """The request was refused and will be refused again (bad argument, unknown job)."""


class PermissionDenied(PermanentError):
    """The supervisor's user lacks the right (e.g. node state changes without SlurmUser/root)."""


class NotLeading(TransientError):
    """This daemon does not lead its instance now (another holds a newer epoch, or its own lease may
    have run out): nothing it writes or does takes effect. Raised by a store refusing a write that
    carries an older epoch than the lease's (a conditional write, in the write's own transaction),
    and by the leadership gate before an action (self-fencing). Transient: it may lead again."""

    def __init__(self, message: str, *, delay: float = 1.0) -> None:
        super().__init__(message, delay=delay)


class CapReached(PermanentError):
    """The node guard's cluster-wide blast-radius cap is spent: the node is kept out of the run but
    not drained. ``frees_at``: when the oldest counted drain leaves the guard's window."""

    def __init__(self, message: str, *, frees_at: float) -> None:
        super().__init__(message)
        self.frees_at = frees_at


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch (UTC). Virtual in tests and in the simulator."""
        ...

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds``; return True when woken early because the daemon must stop."""
        ...


@runtime_checkable
class Scheduler(Protocol):
    """The batch system. One ``snapshot`` per tick serves every supervised run."""

    def snapshot(self, include_nodes: bool | Collection[str] = True) -> ClusterSnapshot:
        """The jobs the scheduler supervises (an adapter may be scoped to one account's) and nodes:
        all (True), none (False), or at least those named (a collection; the answer may hold more).

        Raises TransientError when the controller is unreachable."""
        ...

    def submit(self, request: SubmitRequest) -> int:
        """Submit a batch job; return its job id."""
        ...

    def requeue(self, job_id: int, *, hold: bool = False) -> None: ...

    def hold(self, job_id: int) -> None: ...

    def release(self, job_id: int) -> None: ...

    def cancel(self, job_id: int) -> None:
        """Cancel the job. Cancelling a job that already ended is not an error."""
        ...

    def set_excluded(self, job_id: int, nodes: Sequence[str]) -> None:
        """Replace a pending job's excluded-node list."""
        ...

    def set_node_state(self, node: str, change: NodeChange, reason: str) -> None:
        """Drain, down or resume a node. Raises PermissionDenied without node rights."""
        ...


class NodeGuard(Protocol):
    """The node guard (docs/guard.md), the only holder of node rights when a site runs one: it checks
    each change against Slurm and the caller's kernel identity, applies the cluster-wide cap, writes
    the reason itself, and remembers every instance's faults (the shared quarantine)."""

    def set_node_state(self, node: str, change: NodeChange, run: str, reason: str) -> None:
        """Drain or down ``node`` for ``run``. CapReached over the cluster-wide cap, PermanentError
        when refused, TransientError when the guard does not answer."""
        ...

    def quarantined(self) -> Mapping[str, Quarantine]:
        """The nodes the guard's shared memory keeps out of every run now."""
        ...


class CareHands(Protocol):
    """What the remediation ladder's keeper (engine/act/care.py) reads and does: the node as Slurm
    shows it (boot time included), the validation job's verdict once it reported, and each remedy,
    done through the node guard (PAGE: the site's admins)."""

    def seen(self, node: str) -> NodeSeen: ...

    def verdict(self, node: str) -> ValidationVerdict | None: ...

    def remedy(self, op: CareOp, node: str, why: str) -> None:
        """PermanentError when refused, TransientError when the guard does not answer."""
        ...


class NodeProbe(Protocol):
    """A direct liveness check of nodes' slurmd, faster than Slurm's own SlurmdTimeout."""

    def probe(self, nodes: Iterable[NodeInfo]) -> Mapping[str, str | None]:
        """Per node name: None when alive, else a short description of the failure."""
        ...


class RunStore(Protocol):
    """Runs, their attempts, the nodes each run keeps out, each run's telemetry token.

    ``instance_id`` is random per store: it goes into every submitted job's tag, so a new store
    (or another daemon) never mistakes an older store's job for its own.
    """

    instance_id: str

    def transaction(self) -> AbstractContextManager[object]:
        """Every store write inside the block commits together or not at all (an exception rolls
        all back and propagates). Nested, it joins the one already open: the inner block commits
        nothing by itself, and an exception that leaves the outer block undoes the inner writes too
        (the executor completes an intent and applies its records inside one)."""
        ...

    def add_run(self, spec: RunSpec, now: float, owner_uid: int | None = None) -> None:
        """Register a run (PermanentError when its name is taken, even by one that ended: it keeps
        its logbook); ``owner_uid``: who asked (None: the instance's account)."""
        ...

    def get_run(self, name: str) -> RunRecord | None: ...

    def runs(self, *, active_only: bool = False) -> list[RunRecord]: ...

    def set_state(
        self, name: str, state: RunState, now: float, reason: str | None = None, spend_restart: bool = False
    ) -> None: ...

    def request_cancel(self, name: str, now: float) -> None: ...

    def exclude(self, run: str, node: str, reason: str, now: float) -> None: ...

    def defer(self, run: str, node: str, reason: str, now: float) -> None: ...

    def unexclude(self, run: str, node: str) -> None: ...

    def add_attempt(
        self, run: str, job_id: int, restart_count: int, now: float, excluded: tuple[str, ...] = ()
    ) -> AttemptRecord: ...

    def attempt_started(self, run: str, seq: int, nodes: tuple[str, ...], at: float) -> None: ...

    def attempt_ended(
        self, run: str, seq: int, at: float, end_state: str, reason: str, exit_code: int | None
    ) -> None: ...

    def attempt_progress(
        self,
        run: str,
        seq: int,
        last_step: int,
        step_time_s: float | None,
        hang_pace: HangPace | None = None,
        save_s: float | None = None,
    ) -> None: ...

    def attempt_load_failed(self, run: str, seq: int, why: str, *, before_load: bool = False) -> None:
        """The attempt's log shows its checkpoint load failed (``before_load``: it died before any
        load began), and why."""
        ...

    def attempt_continued(self, run: str, seq: int, checkpoint: str) -> None:
        """The attempt's planned end was continued from ``checkpoint`` (a verified save)."""
        ...

    def attempt_preempted(self, run: str, seq: int, at: float) -> None:
        """Slurm began preempting the attempt at ``at`` (its PreemptTime); the first one is kept."""
        ...

    def set_successor(self, run: str, successor: Successor) -> None:
        """The run's pre-queued next job (one per run; ``RunRecord.successor``); idempotent."""
        ...

    def drop_successor(self, run: str, job_id: int) -> None: ...

    def attempts(self, run: str, last: int | None = None) -> list[AttemptRecord]: ...

    def run_token(self, run: str) -> str:
        """The run's telemetry token (agents and hooks send it); created on first use."""
        ...


@dataclass(frozen=True)
class Intent:
    """An action journaled and not yet completed: ``params`` are the action's JSON parameters as
    ``begin_action`` was given them (``engine.act.intents.action_from`` reads the action back)."""

    id: int  # grows with each begin_action; it goes into a submitted job's tag
    run: str
    kind: str  # an ActionKind value
    params: Mapping[str, Any]
    opened_at: float


class IntentJournal(Protocol):
    """Every action written before it is performed and marked done (or failed) after."""

    def begin_action(self, run: str, kind: str, params: Mapping[str, Any], now: float) -> int: ...

    def complete_action(self, action_id: int, status: str, result: Mapping[str, Any], now: float) -> None: ...

    def open_actions(self) -> list[Intent]:
        """The intents not completed yet, oldest first."""
        ...

    def action_done(self, run: str, kind: str, params: Mapping[str, Any]) -> bool: ...

    def refused_submissions(self, run: str, since: float) -> list[tuple[float, str]]: ...


class Logbook(Protocol):
    """The logbook: for people. No decision reads an event's evidence back."""

    def record_event(self, event: Event) -> bool: ...

    def events(self, run: str | None = None) -> list[Event]: ...

    def last_event(self, run: str, kinds: tuple[EventKind, ...]) -> Event | None: ...

    def events_of(self, run: str, kinds: tuple[EventKind, ...], limit: int | None = None) -> list[Event]: ...


class NodeMemory(Protocol):
    """Node verdicts, faults pinned on nodes (quarantine), node changes made (blast radius),
    operators' quarantine clears."""

    def set_verdict(self, verdict: NodeVerdict) -> None: ...

    def set_node_action(self, node: str, action: str, now: float) -> None: ...

    def verdicts(self) -> list[NodeVerdict]: ...

    def record_node_fault(self, fault: Fault) -> None: ...

    def node_faults(self, since: float) -> list[Fault]: ...

    def keep_findings(self, findings: Iterable[NodeFinding]) -> None: ...

    def active_findings(self) -> dict[str, NodeFinding]: ...

    def record_node_change(self, change: NodeChangeRecord) -> None: ...

    def node_changes(self, since: float) -> list[NodeChangeRecord]: ...

    def clear_quarantine(self, node: str, now: float, by: str, note: str) -> None: ...

    def quarantine_clears(self) -> dict[str, float]: ...


class NodeCareLedger(Protocol):
    """Each node's place on the remediation ladder (``domain.health.ladder``): one record a node,
    kept while the node is on the ladder (crash-only: a restarted daemon resumes it there)."""

    def keep_node_care(self, care: NodeCare, now: float) -> None: ...

    def drop_node_care(self, node: str) -> None: ...

    def node_cares(self) -> dict[str, NodeCare]: ...


class CheckpointLedger(Protocol):
    """Checkpoints seen in each run's storage, their verifications, those passed over and why, and
    the resume plan handed to each attempt."""

    def checkpoint_seen(self, run: str, ref: CheckpointRef, now: float) -> bool: ...

    def checkpoint_state(self, run: str, location: str) -> tuple[bool, float] | None: ...

    def checkpoint_result(self, run: str, result: VerifyResult) -> None: ...

    def demote_checkpoint(self, run: str, location: str, why: str) -> None: ...

    def record_resume_plan(self, run: str, attempt: int, plan: ResumePlan) -> None: ...

    def resume_plans(self, run: str, last: int) -> dict[int, ResumePlan]: ...

    def checkpoints(
        self, run: str, limit: int | None = None
    ) -> list[tuple[CheckpointRef, VerifyResult | None, VerifyResult | None, str | None]]: ...


class RollbackLedger(Protocol):
    """Rollbacks decided after loss spikes that did not heal: planned, done, blocked."""

    def record_rollback(self, rollback: RollbackRecord) -> None: ...

    def rollbacks_done(self, run: str, before_attempt: int) -> None: ...

    def rollbacks(self, run: str) -> list[RollbackRecord]: ...


class ProgressLedger(Protocol):
    """The progress series the daemon read from each attempt's log, bounded per run (thinned)."""

    def record_progress(self, points: Sequence[ProgressPoint]) -> None: ...

    def progress(self, run: str) -> list[ProgressPoint]: ...


class StepLedger(Protocol):
    """In-allocation recovery: each job's step goal (one per generation) and its launcher's last
    report (docs/in-allocation.md)."""

    def set_step_goal(self, run: str, goal: StepGoal) -> bool: ...

    def step_goal(self, run: str, job_id: int) -> StepGoal | None: ...

    def launcher_reported(self, run: str, report: LauncherReport) -> None: ...

    def channel_listening(self, now: float) -> None: ...


class LeaderLease(Protocol):
    """One leader per instance, elected through the store; the epoch every write carries.

    ``claim_lease`` in one transaction: takes the lease when nobody holds it or it expired (a new
    epoch), renews it when ``holder`` holds it (the same epoch), else leaves it and returns the
    holder's. ``hold_epoch`` sets the epoch this connection's writes carry: from then on the store
    refuses (``NotLeading``) every write of it while the lease's epoch is newer; None (the
    default: one daemon, tools) carries none and is never refused."""

    def claim_lease(self, holder: str, address: str, lease_s: float) -> Lease: ...

    def release_lease(self, holder: str) -> None:
        """Let the lease expire now if ``holder`` holds it (a clean stop: a standby takes over at once)."""
        ...

    def lease(self) -> Lease | None: ...

    def hold_epoch(self, epoch: int | None) -> None: ...


class Store(
    RunStore,
    IntentJournal,
    Logbook,
    NodeMemory,
    NodeCareLedger,
    CheckpointLedger,
    RollbackLedger,
    ProgressLedger,
    StepLedger,
    LeaderLease,
    Protocol,
):
    """Everything the daemon remembers (SQLite in production, one class implementing every part)."""


class Accounting(Protocol):
    """Slurm's job accounting (slurmdbd, read with ``sacct``): what became of jobs the controller
    has forgotten — squeue drops a finished job MinJobAge (300 s by default) after it ended."""

    def job_records(self, job_ids: Iterable[int]) -> Mapping[int, JobInfo]:
        """Each job's latest record (its outcome once it ended; ``restart_count`` counts the
        incarnations before it); jobs accounting has no record of are left out. Raises
        TransientError when accounting cannot be reached."""
        ...


class SubmitCheck(Protocol):
    """Asks the scheduler whether it would accept a job, without submitting it (``sbatch
    --test-only``): PermanentError with its words when it would not."""

    def test_submit(self, request: SubmitRequest) -> None: ...


class Fencer(Protocol):
    """Site-specific fencing of a dead node (e.g. power it off through its BMC)."""

    def fence(self, node: str) -> None: ...


class LogSource(Protocol):
    """A job's output file, followed like ``tail -F``: complete lines appended since the last call."""

    def read_lines(self) -> list[str]: ...

    def close(self) -> None: ...


LogOpener = Callable[[str, bool], LogSource]  # (path, start at the end) -> source


class CheckpointStore(Protocol):
    """Where one run keeps its checkpoints: an S3 prefix or a POSIX directory.

    ``verify`` never raises for storage trouble: a storage error, a timeout or a refused request
    gives ``Outcome.UNVERIFIABLE`` with the reason, never ``CORRUPT``. ``discover`` raises
    TransientError when the storage cannot be listed.
    """

    root: str  # "s3://bucket/prefix/" or "/lustre/run/ckpt"

    def discover(self) -> list[CheckpointRef]:
        """Every checkpoint under the root, committed or not, in any layout it recognises."""
        ...

    def verify(self, ref: CheckpointRef, level: Level) -> VerifyResult: ...

    def commit(self, name: str, manifest: Manifest) -> str:
        """Write ``manifest`` as the commit marker of checkpoint ``name`` (refusing to overwrite an
        existing one); return its location."""
        ...


class HealthFeed(Protocol):
    """Node health findings from outside Slurm: node agents and hooks (through the daemon's
    ingest), or the simulator's agents. The engine drains it once per tick."""

    def drain_findings(self) -> list[NodeFinding]:
        """Findings that arrived since the last call, oldest first."""
        ...

    def heartbeat_ages(self, now: float) -> Mapping[str, float]:
        """Per node with an agent: seconds since its last report (stale agents are suspect)."""
        ...


class StackCapture(Protocol):
    """Every rank's Python stacks of a hung job, taken in its allocation (issue 35). Never raises
    and returns within its deadline: nodes that gave no stacks are in ``Capture.missing``, with why."""

    def capture(self, job_id: int, nodes: Sequence[str]) -> Capture: ...


class StackArchive(Protocol):
    """Where captures are kept for people (bounded, with a retention rule): never read back to decide."""

    def keep(self, run: str, name: str, capture: Capture, verdict: StackVerdict) -> str | None:
        """Store one capture; its location, None when it could not be written (logged)."""
        ...
