"""Goodput: how much of a run's wall time trained the model (ETTR), and where the rest went.

Pure: attempts and logbook events in, a :class:`Goodput` value out; the caller says what "now" is.

The wall time of a window is split, piece by piece, into

* **productive** — an attempt was running and its work was kept;
* **rework** — an attempt was running, but the work was thrown away: it lay after the checkpoint
  the next attempt resumed from (``lost_steps`` × ``step_time_s``, or ``last_step`` −
  ``resume_step``, from the incident's evidence);
* **detection** — the job was broken but not yet known to be (a hang's silent time, or an
  ``evidence["detection_s"]``);
* **restart** — from the fault's detection to the next attempt's submission (stopping, draining,
  fencing, resubmitting), and from that attempt's start to its first step after the resume
  (launch, checkpoint load: read from the progress series);
* **queue** — from a submission to the attempt running (the first start included);
* **overhead** — running, but computing no step the model kept: checkpoint saves, slow steps (with
  the progress series: productive time is the kept steps times the run's pace, goodput_steps);
* **idle** — none of the above (before the first submission, after the run ended or after the
  supervision's last record).

ETTR = productive / wall. Given the progress series the daemon read, productive time is measured
from the steps kept; without it (or where work lost since the checkpoint is not recorded) running
time counts as productive and the report says that the ETTR is then an upper bound. Each interruption's cause is mapped onto the categories of Llama 3 405B's
Table 5 (GPU, Host, Network, Dependency, Unplanned Maintenance, Unknown) where the evidence names
one, and onto a category of our own, flagged as outside the table, where it does not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from supervisor.domain.goodput.advice import SAVE_KEYS, CheckpointAdvice, checkpoint_advice, measured_save_s
from supervisor.domain.goodput.causes import classify
from supervisor.domain.goodput.interruption import OPENERS, Interruption, detection, int_of, merged, num
from supervisor.domain.goodput.steps import (
    AttemptSteps,
    Known,
    attempt_steps,
    overhead,
    pace_s,
    productive_s,
    unmeasured_note,
)
from supervisor.domain.goodput.swaps import SpareEconomics, note_of, spare_economics, swap_interruptions
from supervisor.domain.goodput.sweep import Claim, Lost, back_from, sweep
from supervisor.domain.progress.series import ProgressPoint
from supervisor.domain.records import AttemptRecord, Event, EventKind

DAY_S = 86400.0
KINDS = ("rework", "detection", "restart", "queue", "overhead")


@dataclass(frozen=True)
class Goodput:
    run: str
    start: float
    end: float
    productive_s: float
    running_s: float
    idle_s: float
    lost: Lost
    by_cause: Mapping[str, Lost]
    interruptions: tuple[Interruption, ...]
    notes: tuple[str, ...] = field(default=())
    # productive time measured from the kept steps (True), not measurable from the series given
    # (False), or no series given (None: running time counts as productive)
    measured: bool | None = None
    spares: SpareEconomics | None = None  # in-allocation runs: the hot spares' cost and the swaps' saving

    @property
    def wall_s(self) -> float:
        return max(0.0, self.end - self.start)

    @property
    def ettr(self) -> float | None:
        """Productive time / wall time; None for an empty window."""
        return self.productive_s / self.wall_s if self.wall_s > 0 else None

    @property
    def unknown_lost_work(self) -> int:
        return sum(1 for i in self.interruptions if i.lost_work_s is None)

    @property
    def upper_bound(self) -> bool:
        """The ETTR may be too high: lost work not on record, or productive time not measured."""
        return bool(self.unknown_lost_work) or self.measured is False

    @property
    def interruptions_per_day(self) -> float | None:
        return len(self.interruptions) / (self.wall_s / DAY_S) if self.wall_s > 0 else None

    @property
    def mtbi_s(self) -> float | None:
        """Mean running time between interruptions (None before the first one)."""
        return self.running_s / len(self.interruptions) if self.interruptions else None

    def advice(self, save_s: float | None, saves_on_failure: bool = False) -> CheckpointAdvice:
        """Young's interval. A trainer that saves on failure ([checkpoints] save_on_failure_s) plans
        its periodic saves for the interruptions that still threw work away: one whose restart
        resumed at the step it had reached (its survivors' save) lost none."""
        if not saves_on_failure:
            return checkpoint_advice(self.mtbi_s, save_s)
        losing = sum(1 for i in self.interruptions if i.lost_steps is None or i.lost_steps > 0)
        if self.interruptions and not losing:
            why = "every interruption lost no work (the survivors saved on failure): no rate to plan for"
            return CheckpointAdvice(None, save_s, None, why)
        return checkpoint_advice(self.running_s / losing if losing else None, save_s)


# ---------------------------------------------------------------- interruptions


def interruptions(
    attempts: Sequence[AttemptRecord],
    events: Iterable[Event],
    steps: Mapping[int, AttemptSteps] | None = None,
    pace: float | None = None,
    series: Sequence[ProgressPoint] | None = None,
) -> list[Interruption]:
    """One per attempt that a fault, rollback or requeue ended, and one per in-allocation swap
    (goodput_swaps), oldest first. ``steps`` (the progress series, goodput_steps), the run's
    ``pace`` and the ``series`` fill in what the events leave out: the last step the attempt
    logged, its successor's (or the relaunched step's) start-up."""
    events = list(events)
    swapped, taken = swap_interruptions(events, series, pace)
    by_attempt: dict[int | None, list[Event]] = {}
    for e in (e for e in events if e.key not in taken and not note_of(e, "swap")):
        by_attempt.setdefault(e.attempt, []).append(e)
    seqs = sorted(a.seq for a in attempts)
    by_seq = {a.seq: a for a in attempts}
    known = Known(steps or {}, pace)
    out = []
    for seq, evs in by_attempt.items():
        opening = [e for e in evs if e.kind.value in OPENERS]
        if not opening:
            continue
        later = [s for s in seqs if seq is not None and s > seq]
        first_at = min(e.at for e in opening)
        incident = [e for e in evs if e.at >= first_at] + _restart_events(by_attempt, later)
        failed = by_seq.get(seq) if seq is not None else None
        out.append(_interruption(opening, incident, failed, by_seq.get(later[0]) if later else None, known))
    out += swapped
    return sorted(out, key=lambda i: (i.at, i.attempt if i.attempt is not None else -1))


def _restart_events(by_attempt: Mapping[int | None, list[Event]], later: list[int]) -> list[Event]:
    """The next attempt's restart event: it names the checkpoint it resumed from."""
    if not later:
        return []
    return [e for e in by_attempt.get(later[0], []) if e.kind in (EventKind.RESTARTED, EventKind.SUBMITTED)]


def _interruption(
    opening: list[Event], incident: list[Event], failed: AttemptRecord | None, nxt: AttemptRecord | None, known: Known
) -> Interruption:
    first = min(opening, key=lambda e: e.at)
    ev = merged(incident)
    resume = int_of(ev, "resume_step")
    resume = resume if resume is not None else known.resume_step(nxt)
    lost_steps, lost_work = _lost_work(ev, resume, known.last_step(failed), known.pace)
    restart = queue = None
    if nxt is not None:
        startup = known.startup_s(nxt) or 0.0
        restart = max(0.0, nxt.submitted_at - first.at) + startup
        queue = max(0.0, nxt.started_at - nxt.submitted_at) if nxt.started_at is not None else None
    return Interruption(
        first.run,
        first.attempt,
        first.at,
        classify(opening),
        detection(ev, first, failed),
        restart,
        queue,
        lost_work,
        lost_steps,
        resume,
    )


def _lost_work(
    ev: Mapping[str, Any], resume: int | None, logged: int | None, pace: float | None
) -> tuple[int | None, float | None]:
    """(steps, seconds) of work since the checkpoint the restart used: the evidence's figures, else
    the last step logged less the resume step, at the step time on record (else the run's pace)."""
    lost_steps = int_of(ev, "lost_steps")
    last = int_of(ev, "last_step")
    last = last if last is not None else logged
    if lost_steps is None and resume is not None and last is not None:
        lost_steps = max(0, last - resume)
    step_time = num(ev, "step_time_s")  # per step; a hang's step_interval_s is per log record
    step_time = pace if pace is not None else step_time
    lost_work = num(ev, "lost_work_s")
    if lost_work is None and lost_steps is not None and step_time is not None:
        lost_work = lost_steps * step_time
    return lost_steps, lost_work


# ---------------------------------------------------------------- accounting


def goodput(
    run: str,
    attempts: Sequence[AttemptRecord],
    events: Sequence[Event],
    *,
    now: float,
    start: float | None = None,
    end: float | None = None,
    series: Sequence[ProgressPoint] | None = None,
    run_nodes: int | None = None,
) -> Goodput:
    """The run's goodput over [start, end] (default: first submission to the run's end, or ``now``).

    ``series``: the progress series the daemon read (the store's); with it, productive time is the
    kept steps' time and the start-up after each restart is lost. ``now`` is also where the record
    ends: no running after it is counted (the supervision's last record, for a run no longer
    supervised). ``run_nodes``: the run's node count (its spec's), to count the hot spares a job
    held beyond it; without it, what the swaps' evidence says."""
    attempts = sorted((a for a in attempts if a.run == run), key=lambda a: a.seq)
    events = [e for e in events if e.run == run]
    mine = [p for p in series if p.run == run] if series is not None else None
    pace = pace_s(mine) if mine else None
    steps = attempt_steps(attempts, events, mine, pace) if mine is not None else {}
    run_end = _run_end(events, now)
    lo = start if start is not None else (attempts[0].submitted_at if attempts else run_end)
    hi = min(end if end is not None else run_end, now)
    found = interruptions(attempts, events, steps, pace, mine)
    segments = [
        (a.started_at, min(a.ended_at, run_end) if a.ended_at is not None else run_end)
        for a in attempts
        if a.started_at is not None
    ]
    claims = _claims(attempts, found, segments, run_end, Known(steps, pace))
    productive, running, idle, lost, by_cause = sweep(lo, hi, segments, claims)
    measured = None if mine is None else productive_s(steps, attempts, pace, lo, hi)
    if measured is not None:
        productive, lost, by_cause = overhead(productive, measured, lost, by_cause)
    inside = tuple(i for i in found if lo <= i.at < hi or (i.at == hi == run_end))
    notes = _notes(inside) + (unmeasured_note(mine) if mine is not None and measured is None else ())
    flag = None if mine is None else measured is not None
    spares = spare_economics(attempts, events, found, run_nodes, hi)
    return Goodput(run, lo, max(lo, hi), productive, running, idle, lost, by_cause, inside, notes, flag, spares)


def windows(
    run: str,
    attempts: Sequence[AttemptRecord],
    events: Sequence[Event],
    *,
    now: float,
    width_s: float = DAY_S,
    series: Sequence[ProgressPoint] | None = None,
) -> list[Goodput]:
    """Goodput per consecutive window of ``width_s`` (a day by default) from the first submission."""
    if width_s <= 0:
        raise ValueError(f"window width must be positive, got {width_s}")
    whole = goodput(run, attempts, events, now=now, series=series)
    out, t = [], whole.start
    while t < whole.end:
        out.append(goodput(run, attempts, events, now=now, start=t, end=min(t + width_s, whole.end), series=series))
        t += width_s
    return out


def _run_end(events: Sequence[Event], now: float) -> float:
    terminal = [e.at for e in events if e.kind in (EventKind.COMPLETED, EventKind.GAVE_UP, EventKind.CANCELLED)]
    if terminal:
        return min(max(terminal), now)
    return now


def _claims(
    attempts: Sequence[AttemptRecord],
    found: Sequence[Interruption],
    segments: Sequence[tuple[float, float]],
    run_end: float,
    known: Known,
) -> list[Claim]:
    claims: list[Claim] = []
    if attempts:
        a0 = attempts[0]
        began = a0.started_at if a0.started_at is not None else run_end
        claims.append((a0.submitted_at, began, "queue", "First start"))
        claims.append((began, began + (known.startup_s(a0) or 0.0), "restart", "First start"))
    for i in found:
        cat = i.cause.category
        if i.detection_s:
            claims.append((i.onset, i.at, "detection", cat))
        if i.lost_work_s:
            claims += [(a, b, "rework", cat) for a, b in back_from(i.onset, i.lost_work_s, segments)]
        if i.in_allocation:  # the same job: restarting until the step computes again, no queue
            claims.append((i.at, i.at + i.restart_s if i.restart_s is not None else run_end, "restart", cat))
            continue
        nxt = next((a for a in attempts if i.attempt is not None and a.seq > i.attempt), None)
        submitted = nxt.submitted_at if nxt is not None else run_end
        claims.append((i.at, submitted, "restart", cat))
        if nxt is not None:
            began = nxt.started_at if nxt.started_at is not None else run_end
            claims.append((nxt.submitted_at, began, "queue", cat))
            claims.append((began, began + (known.startup_s(nxt) or 0.0), "restart", cat))
    claims += _continuation_claims(attempts, run_end, known)
    return [c for c in claims if c[1] > c[0]]


CONTINUATION = "continuation"  # the cause of a planned end's gap: a line of its own, not an interruption
PREEMPTED = "preempted"  # a preemption's gap, continued after the grace save: its own line too


def _continuation_claims(attempts: Sequence[AttemptRecord], run_end: float, known: Known) -> list[Claim]:
    """A planned end continued (domain.decide.continuation): no interruption and no lost work, but
    its cost on a line of its own — the gap from the job's end to its successor's submission
    ("restart"), the successor's wait in the queue after that end, and its start-up (checkpoint
    load). A successor queued before the end waits only from the end. (The save before the end is
    running time: with the progress series it is overhead.) A preempted job's gap is 'preempted'."""
    claims: list[Claim] = []
    for i, a in enumerate(attempts):
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        if a.continued_with is None or a.ended_at is None:
            continue
        cause = PREEMPTED if a.end_state == "PREEMPTED" or a.preempted_at is not None else CONTINUATION
        if nxt is None:
            claims.append((a.ended_at, run_end, "restart", cause))
            continue
        submitted = max(a.ended_at, nxt.submitted_at)
        began = nxt.started_at if nxt.started_at is not None else run_end
        claims.append((a.ended_at, submitted, "restart", cause))
        claims.append((submitted, began, "queue", cause))
        claims.append((began, began + (known.startup_s(nxt) or 0.0), "restart", cause))
    return claims


def _notes(found: Sequence[Interruption]) -> tuple[str, ...]:
    notes = []
    unknown = [i for i in found if i.lost_work_s is None]
    if unknown:
        notes.append(
            f"work lost since the checkpoint is not on record for {len(unknown)} of {len(found)} "
            "interruption(s) (no lost_steps, or resume_step with the last step): the ETTR is an upper "
            "bound"
        )
    undetected = [i for i in found if i.detection_s is None]
    if undetected:
        notes.append(
            f"detection time is not on record for {len(undetected)} of {len(found)} interruption(s): "
            "counted from the moment the supervisor knew"
        )
    return tuple(notes)


__all__ = [  # the advice lives in goodput_advice; readers import it from here too
    "DAY_S",
    "KINDS",
    "OPENERS",
    "SAVE_KEYS",
    "CheckpointAdvice",
    "Goodput",
    "Interruption",
    "SpareEconomics",
    "checkpoint_advice",
    "goodput",
    "interruptions",
    "measured_save_s",
    "windows",
]
