"""One run at a glance, for on-call (``slurm-supervisor status RUN``): its state and since when,
ETTR, the last incident, the last verified checkpoint and when the next one is due.

Pure: records and ``now`` in, a ``RunSummary`` out. What pages right now is the pager's to say
(adapters.paging.webhook); the caller passes it in.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from supervisor.domain.goodput.account import goodput
from supervisor.domain.progress.series import ProgressPoint
from supervisor.domain.records import AttemptRecord, Event, EventKind, RunRecord
from supervisor.domain.run import RunState
from supervisor.report.chronicle import last_record
from supervisor.report.fold import IncidentStart, incidents

# The events that put a run in each state: "since when" is the newest of them.
_ENTERED_BY: dict[RunState, frozenset[EventKind]] = {
    RunState.QUEUED: frozenset({EventKind.SUBMITTED, EventKind.RESTARTED, EventKind.REQUEUED}),
    RunState.RUNNING: frozenset({EventKind.STARTED}),
    RunState.RECOVERING: frozenset({EventKind.FAULT, EventKind.STOPPED, EventKind.MASS_FAULT}),
    RunState.COMPLETED: frozenset({EventKind.COMPLETED}),
    RunState.FAILED: frozenset({EventKind.GAVE_UP}),
    RunState.CANCELLED: frozenset({EventKind.CANCELLED}),
}


@dataclass(frozen=True)
class NextCheckpoint:
    """When the next verified checkpoint is expected, and on what basis."""

    at: float
    interval_s: float
    basis: str  # "the run's [checkpoints] expected_interval_s" or "the median gap of the last N"


@dataclass(frozen=True)
class RunSummary:
    run: RunRecord
    now: float
    since: float  # when the run entered its state (its registration when no event says)
    ettr: float | None
    ettr_upper_bound: bool
    last_incident: IncidentStart | None
    incidents: int
    last_checkpoint: Event | None  # the newest checkpoint_verified event
    next_checkpoint: NextCheckpoint | None  # None: the run ended, or nothing to go by
    paging: tuple[str, ...]  # what pages now, in words (empty: nothing)


def summarize(
    run: RunRecord,
    attempts: Sequence[AttemptRecord],
    events: Sequence[Event],
    now: float,
    paging: Sequence[str] = (),
    series: Sequence[ProgressPoint] | None = None,
) -> RunSummary:
    """The run's summary as of ``now`` (a run that ended: as of its last record)."""
    newest = last_record(list(attempts), list(events))
    now = newest if run.state.terminal else max(now, newest)
    g = goodput(run.name, list(attempts), list(events), now=now, series=series)
    found = incidents(events)
    verified = [e for e in events if e.kind is EventKind.CHECKPOINT_VERIFIED]
    return RunSummary(
        run=run,
        now=now,
        since=state_since(run, events),
        ettr=g.ettr,
        ettr_upper_bound=bool(g.unknown_lost_work),
        last_incident=found[-1] if found else None,
        incidents=len(found),
        last_checkpoint=max(verified, key=_newest) if verified else None,
        next_checkpoint=None if run.state.terminal else next_checkpoint(run, verified),
        paging=tuple(paging),
    )


def state_since(run: RunRecord, events: Sequence[Event]) -> float:
    """When the run entered its present state: the newest event that puts a run there."""
    kinds = _ENTERED_BY.get(run.state, frozenset())
    times = [e.at for e in events if e.kind in kinds]
    return max(times, default=run.created_at)


def next_checkpoint(run: RunRecord, verified: Sequence[Event]) -> NextCheckpoint | None:
    """The newest verified checkpoint plus the run's checkpoint interval: the one its
    ``[checkpoints]`` section declares, else the median gap between the last verified ones."""
    if not verified:
        return None
    newest = max(e.at for e in verified)
    policy = run.spec.checkpoints
    if policy is not None and policy.expected_interval_s:
        return NextCheckpoint(newest + policy.expected_interval_s, policy.expected_interval_s, "[checkpoints] interval")
    times = sorted({e.at for e in verified})[-21:]  # distinct times: a scan verifies several at once
    gaps = [b - a for a, b in zip(times, times[1:], strict=False) if b > a]
    if not gaps:
        return None
    interval = statistics.median(gaps)
    return NextCheckpoint(newest + interval, interval, f"median gap of the last {len(gaps) + 1} verified")


def _newest(e: Event) -> tuple[float, int]:
    """Verified checkpoints by time, then step (one scan verifies several in the same instant)."""
    step = e.evidence.get("step")
    return e.at, step if isinstance(step, int) else -1
