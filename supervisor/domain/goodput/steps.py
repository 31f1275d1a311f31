"""Productive time from the steps on record: the steps each attempt kept, times the run's pace.

A second of running is productive only if a step that the model kept was computed in it. The
progress series says, per attempt, which step it resumed from (its submission's ``resume_step``),
when its first step after the resume was read and how far it got; the next attempt's resume step
says where the kept work ends (what came after it was redone). The run's pace is the median logged
seconds per step: time spent saving checkpoints, starting up or on slow steps is not a step's, so
it is not productive either. Pure.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from supervisor.domain.goodput.sweep import Lost
from supervisor.domain.progress.series import ProgressPoint
from supervisor.domain.records import AttemptRecord, Event, EventKind

_STARTS = (EventKind.SUBMITTED, EventKind.RESTARTED)
OVERHEAD = "Between interruptions (saves, slow steps)"  # the cause row of overhead time


@dataclass(frozen=True)
class AttemptSteps:
    """What the record shows of one attempt's training: where it resumed, when it began computing,
    the steps it logged (``track``: (read time, step), rising) and how far it got."""

    seq: int
    resume_step: int | None  # None: not on record
    computing_at: float | None  # the first step after the resume began (None: no step read)
    track: tuple[tuple[float, int], ...]
    last_step: int | None

    def step_at(self, t: float) -> int | None:
        """The step reached by ``t`` (read times, linear between reads; None before it computed)."""
        if self.computing_at is None or self.resume_step is None or t <= self.computing_at:
            return self.resume_step
        times = [self.computing_at] + [at for at, _ in self.track]
        steps = [self.resume_step] + [s for _, s in self.track]
        i = bisect.bisect_right(times, t)
        if i >= len(times):
            return steps[-1]
        t0, t1, s0, s1 = times[i - 1], times[i], steps[i - 1], steps[i]
        return s0 + int((s1 - s0) * (t - t0) / (t1 - t0)) if t1 > t0 else s1


def pace_s(series: Iterable[ProgressPoint]) -> float | None:
    """The run's seconds per step: the median the log printed (None: it printed none)."""
    values = [p.step_time_s for p in series if p.step_time_s is not None and p.step_time_s > 0]
    return statistics.median(values) if values else None


def resume_steps(events: Iterable[Event]) -> dict[int, int]:
    """Each attempt's resume step from its submission's evidence (0: it started from scratch)."""
    out: dict[int, int] = {}
    for e in events:
        if e.kind not in _STARTS or e.attempt is None or "resume_step" not in e.evidence:
            continue
        step = e.evidence["resume_step"]
        if step is None and _from_scratch(e.evidence.get("resume")):
            out[e.attempt] = 0
        elif isinstance(step, int) and not isinstance(step, bool) and step >= 0:
            out[e.attempt] = step
    return out


def _from_scratch(plan: object) -> bool:
    return plan is None or (isinstance(plan, Mapping) and plan.get("checkpoint") is None)


def attempt_steps(
    attempts: Sequence[AttemptRecord], events: Iterable[Event], series: Sequence[ProgressPoint], pace: float | None
) -> dict[int, AttemptSteps]:
    """Each attempt's steps on record, by seq."""
    resumes = resume_steps(events)
    by_seq: dict[int, list[ProgressPoint]] = {}
    for p in series:
        by_seq.setdefault(p.attempt, []).append(p)
    out = {}
    for a in attempts:
        points = sorted(by_seq.get(a.seq, []), key=lambda p: (p.at, p.step))
        resume = resumes.get(a.seq)
        track = _rising(points)
        last = max([s for _, s in track] + ([a.last_step] if a.last_step is not None else []), default=None)
        computing = _computing_at(a, points, resume, pace)
        if last is None and series and a.ended_at is not None and a.started_at is not None:
            # The run's log is read and this attempt ended without a step: it never got past its
            # resume (it died starting up or loading); all its running was start-up.
            last, computing = resume, a.ended_at
        out[a.seq] = AttemptSteps(a.seq, resume, computing, track, last)
    return out


def _rising(points: Sequence[ProgressPoint]) -> tuple[tuple[float, int], ...]:
    """(read time, highest step read by then), one per read time."""
    out: list[tuple[float, int]] = []
    for p in points:
        if out and out[-1][0] == p.at:
            out[-1] = (p.at, max(out[-1][1], p.step))
        elif not out or p.step > out[-1][1]:
            out.append((p.at, p.step))
    return tuple(out)


def _computing_at(
    a: AttemptRecord, points: Sequence[ProgressPoint], resume: int | None, pace: float | None
) -> float | None:
    """When the first step after the resume began: the first step read, less the steps it reports
    since the resume at the run's pace; never before the attempt started."""
    if not points or resume is None or pace is None or a.started_at is None:
        return None
    first = min(points, key=lambda p: (p.step, p.at))
    return max(a.started_at, min(first.at, first.at - (first.step - resume) * pace))


def productive_s(
    steps: Mapping[int, AttemptSteps], attempts: Sequence[AttemptRecord], pace: float | None, lo: float, hi: float
) -> float | None:
    """Seconds of kept steps computed in [lo, hi]; None when an attempt running then has no steps
    on record (no resume step, no series) or the log prints no step time."""
    if pace is None:
        return None
    ordered = sorted(attempts, key=lambda a: a.seq)
    total = 0
    for i, a in enumerate(ordered):
        if a.started_at is None or a.started_at >= hi or (a.ended_at is not None and a.ended_at <= lo):
            continue
        mine = steps.get(a.seq)
        if mine is None or mine.resume_step is None or mine.last_step is None:
            return None
        nxt = steps.get(ordered[i + 1].seq) if i + 1 < len(ordered) else None
        top = mine.last_step if nxt is None or nxt.resume_step is None else min(mine.last_step, nxt.resume_step)
        total += _kept(mine, top, lo, hi)
    return total * pace


def _kept(mine: AttemptSteps, top: int, lo: float, hi: float) -> int:
    """Kept steps (from the resume step up to ``top``) this attempt computed in [lo, hi]."""
    base = mine.resume_step or 0
    if top <= base:
        return 0
    a, b = mine.step_at(lo), mine.step_at(hi)
    a, b = min(max(a or base, base), top), min(max(b or base, base), top)
    return max(0, b - a)


@dataclass(frozen=True)
class Known:
    """The progress series' evidence, by attempt seq, and the run's seconds per step."""

    steps: Mapping[int, AttemptSteps]
    pace: float | None

    def startup_s(self, a: AttemptRecord | None) -> float | None:
        """From the attempt's start to its first step after the resume (None: not on record)."""
        mine = self.steps.get(a.seq) if a is not None else None
        if a is None or mine is None or mine.computing_at is None or a.started_at is None:
            return None
        return max(0.0, mine.computing_at - a.started_at)

    def last_step(self, a: AttemptRecord | None) -> int | None:
        mine = self.steps.get(a.seq) if a is not None else None
        return mine.last_step if mine is not None else (a.last_step if a is not None else None)

    def resume_step(self, a: AttemptRecord | None) -> int | None:
        mine = self.steps.get(a.seq) if a is not None else None
        return mine.resume_step if mine is not None else None


def overhead(
    unclaimed: float, measured: float, lost: Lost, by_cause: dict[str, Lost]
) -> tuple[float, Lost, dict[str, Lost]]:
    """Running time no claim explains and no kept step used is overhead (saves, slow steps)."""
    productive = min(unclaimed, measured)
    extra = unclaimed - productive
    if extra <= 0:
        return productive, lost, by_cause
    by_cause = {**by_cause, OVERHEAD: by_cause.get(OVERHEAD, Lost()).plus("overhead", extra)}
    return productive, lost.plus("overhead", extra), dict(sorted(by_cause.items()))


def unmeasured_note(series: Sequence[ProgressPoint]) -> tuple[str, ...]:
    why = "no step on record" if not series else "an attempt's resume step or steps are not on record"
    return (f"productive time is not measured from the training steps ({why}): running time counts as productive",)
