"""Runs and their incarnations: the run state machine, the run spec, the restart budget."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class RunState(StrEnum):
    """Where a supervised run stands.

    REGISTERED  accepted by the supervisor, no job submitted yet
    QUEUED      a job of the run is pending in Slurm
    RUNNING     the run's job is running
    RECOVERING  a fault was seen; the supervisor is fencing, draining and restarting
    COMPLETED   the job finished with exit code 0 (terminal)
    FAILED      the supervisor gave up: budget spent, a do-not-restart exit code (terminal)
    CANCELLED   cancelled by a person, through the supervisor or Slurm (terminal)
    """

    REGISTERED = "registered"
    QUEUED = "queued"
    RUNNING = "running"
    RECOVERING = "recovering"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED)


_S = RunState
TRANSITIONS: Mapping[RunState, frozenset[RunState]] = {
    _S.REGISTERED: frozenset({_S.QUEUED, _S.RUNNING, _S.FAILED, _S.CANCELLED}),
    _S.QUEUED: frozenset({_S.RUNNING, _S.RECOVERING, _S.COMPLETED, _S.FAILED, _S.CANCELLED}),
    _S.RUNNING: frozenset({_S.QUEUED, _S.RECOVERING, _S.COMPLETED, _S.FAILED, _S.CANCELLED}),
    _S.RECOVERING: frozenset({_S.QUEUED, _S.RUNNING, _S.FAILED, _S.CANCELLED}),
    _S.COMPLETED: frozenset(),
    _S.FAILED: frozenset(),
    _S.CANCELLED: frozenset(),
}


class IllegalTransition(ValueError):
    def __init__(self, run: str, source: RunState, target: RunState) -> None:
        allowed = ", ".join(sorted(TRANSITIONS[source])) or "none (terminal)"
        super().__init__(f"run {run!r}: illegal transition {source} -> {target}; allowed: {allowed}")
        self.source = source
        self.target = target


def transition(run: str, source: RunState, target: RunState) -> RunState:
    """Return ``target`` if the table allows ``source -> target`` (or it is no change), else raise."""
    if source is target or target in TRANSITIONS[source]:
        return target
    raise IllegalTransition(run, source, target)


class SparePolicy(StrEnum):
    NAMED = "named"  # only the listed spare nodes stand in; the run avoids them until needed
    PARTITION_IDLE = "partition-idle"  # any idle node of the partition may stand in


class RestartMode(StrEnum):
    RESUBMIT = "resubmit"  # cancel the broken job, submit a fresh one with --exclude (default)
    REQUEUE = "requeue"  # let Slurm requeue the same job id, then fix its ExcNodeList
    IN_ALLOCATION = "in-allocation"  # keep the job (--no-kill): swap a hot spare into the step (docs/in-allocation.md)


class Trust(StrEnum):
    """``[checkpoints] trust``: which checkpoints a run resumes from, by who vouches for them
    (domain.checkpoints.signing and .origin)."""

    ANY = "any"  # no origin checks: a whole checkpoint is enough, whoever wrote it
    OWNER = "owner"  # default: files the account owns (POSIX); a manifest's signature, when present, must match
    STRICT = "strict"  # the account's files, not writable by group or others, and a manifest signed by the run


DEFAULT_DO_NOT_RESTART = (93,)  # nvidia-resiliency-ext: "do not requeue"


class ExitMeaning(StrEnum):
    """What a job's exit code means to the policy (``domain.decide.exit_codes`` holds the table;
    docs/configuration.md the defaults). The policy reads the meaning, never the number."""

    RESTART = "restart"  # a fault of the job: restart it from the newest verified checkpoint
    RESTART_ELSEWHERE = "restart-elsewhere"  # restart with the attempt's nodes kept out (Megatron's 16)
    CONTINUE = "continue"  # "saved, continue me": a planned end, continued after a verified save
    STOP = "stop"  # do not restart: the run fails and pages (NVRx's 93, Megatron's 17)


DEFAULT_CONTINUE_EXIT_CODE = 75  # sysexits' EX_TEMPFAIL: "temporary failure, try again"


@dataclass(frozen=True)
class ContinuationPolicy:
    """How the run's jobs end on purpose (the ``[continuation]`` section): a week-long run on a
    partition with a time limit is a chain of jobs, each continued from the checkpoint its
    predecessor saved (domain.decide.continuation)."""

    signal: str | None = "USR1"  # Slurm sends it before the limit (--signal=B:SIG@lead_s); None: none asked
    lead_s: int = 600  # ... this long before the limit (Slurm may send it up to a minute earlier)
    batch_shell: bool = True  # to the batch shell ("B:"), which hands it to the trainer; False: to every step
    exit_code: int = DEFAULT_CONTINUE_EXIT_CODE  # the trainer's "saved, continue me"
    # Megatron's --exit-duration-in-mins saves and exits 0: below this step, exit 0 is a continuation
    target_step: int | None = None
    max_without_progress: int = 3  # continuations in a row without a newer verified checkpoint: blocked
    # Pre-queue the next job this long before the job's limit (0: at its end); needs time_limit_s
    # and [checkpoints] resume_file: the successor reads the checkpoint there as of its start
    prequeue_s: int = 0
    time_limit_s: int | None = None  # the job's time limit (its --time), when pre-queueing


@dataclass(frozen=True)
class CheckpointPolicy:
    """Where a run's checkpoints live and how the supervisor checks them (the ``[checkpoints]`` section)."""

    root: str  # "s3://bucket/prefix/" or an absolute directory
    endpoint_url: str | None = None  # S3-compatible server; None: AWS's from the environment
    region: str | None = None
    full_verify: bool = True  # after the metadata check, read every byte in the background
    bandwidth_mb_s: float | None = 200.0  # cap on background full verification; None: no cap
    scan_interval_s: float = 60.0  # how often the root is listed for new checkpoints
    upload_grace_s: float = 900.0  # shards without a commit marker younger than this are "in progress"
    expected_interval_s: float | None = None  # the run's checkpoint interval, for the staleness alarm
    alarm_intervals: float = 3.0  # alarm when no verified checkpoint for this many expected intervals
    allow_adopted: bool = True  # resume from adopted layouts (DCP, Megatron, NeMo) without our manifest
    trust: Trust = Trust.OWNER  # whose checkpoints are resumed from (domain.checkpoints.origin)
    resume_file: str | None = None  # where the chosen checkpoint is written for the job (shared FS)
    # The trainer's surviving ranks save a checkpoint when a rank fails (docs/checkpoints.md): a
    # step or job that still runs when a node of it faults is given this long, from the fault's
    # onset, to save and exit by itself before it is stopped. 0: the trainer does not.
    save_on_failure_s: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "trust", Trust(self.trust))  # a stored spec's JSON holds the text


@dataclass(frozen=True)
class SpikePolicy:
    """Loss-spike handling for a run (the ``[spikes]`` section). Detection always runs on the log;
    rollbacks need ``[checkpoints]`` (a verified checkpoint to go back to)."""

    rollback: bool = True  # roll back by itself when a spike does not heal; False: log and page only
    heal_window_steps: int = 200
    min_steps_before: int = 100
    skip_batches: int = 300
    max_rollbacks: int = 3
    window_h: float = 24.0
    lr_scale_repeat: float = 0.5


@dataclass(frozen=True)
class RestartPacing:
    """How restarts are spaced out after fast failures (``[restart]``; see ``domain.decide.backoff``)."""

    fast_failure_s: float = 600.0  # an attempt that ends within this long of starting failed fast
    base_s: float = 30.0  # the delay after the first fast failure
    max_s: float = 1800.0  # ... doubling up to this
    jitter: float = 0.2  # ± this fraction of the delay
    crash_loop_after: int = 6  # this many fast failures in a row are a crash loop
    crash_loop_pause_s: float = 3600.0  # ... and each restart then waits this long

    def __post_init__(self) -> None:
        if not (0 < self.base_s <= self.max_s and 0 <= self.jitter < 1 and self.crash_loop_after >= 1):
            raise ValueError(
                "restart pacing: need 0 < backoff_base_s <= backoff_max_s, 0 <= jitter < 1, crash_loop_after >= 1"
            )


@dataclass(frozen=True)
class RunSpec:
    """What a person asked for. Paths are absolute by the time they reach the domain."""

    name: str
    script: str
    partition: str
    nodes: int
    sbatch_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    output: str | None = None
    workdir: str | None = None
    spare_policy: SparePolicy = SparePolicy.PARTITION_IDLE
    spare_nodes: tuple[str, ...] = ()  # expanded hostlist
    max_restarts: int = 10
    do_not_restart_exit_codes: frozenset[int] = frozenset(DEFAULT_DO_NOT_RESTART)
    exit_codes: Mapping[int, ExitMeaning] = field(default_factory=dict)  # the spec's own meanings, over the defaults
    continuation: ContinuationPolicy | None = None  # [continuation]; None: no signal asked of Slurm
    restart_mode: RestartMode = RestartMode.RESUBMIT
    pacing: RestartPacing = field(default_factory=RestartPacing)
    checkpoints: CheckpointPolicy | None = None
    spikes: SpikePolicy = field(default_factory=SpikePolicy)
    hot_spares: int = 0  # in-allocation mode: nodes the job holds beyond ``nodes``, warm
    launcher_timeout_s: float = 60.0  # in-allocation mode: a launcher silent this long is gone

    @property
    def save_on_failure_s(self) -> float:
        """How long the trainer's survivors need to save when a rank fails (0: they do not)."""
        return self.checkpoints.save_on_failure_s if self.checkpoints is not None else 0.0
