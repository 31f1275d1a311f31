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
  fencing, resubmitting);
* **queue** — from a submission to the attempt running (the first start included);
* **idle** — none of the above (before the first submission, after the run ended).

ETTR = productive / wall. Where the work lost since the checkpoint is not recorded it is *unknown*,
not zero: it stays in "productive", the report counts such interruptions and says that the ETTR is
then an upper bound. Each interruption's cause is mapped onto the categories of Llama 3 405B's
Table 5 (GPU, Host, Network, Dependency, Unplanned Maintenance, Unknown) where the evidence names
one, and onto a category of our own, flagged as outside the table, where it does not.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from supervisor.domain.causes import Cause, classify
from supervisor.domain.goodput_sweep import Claim, Lost, back_from, sweep
from supervisor.domain.records import AttemptRecord, Event, EventKind

DAY_S = 86400.0
KINDS = ("rework", "detection", "restart", "queue")
# Event kinds that open an interruption: ours, and those other issues add (matched by value, so an
# older store without them still loads).
OPENERS = frozenset({"fault", "requeued", "rollback", "hang", "mass_fault"})
SAVE_KEYS = ("save_s", "write_s")  # evidence of a checkpoint save's duration


@dataclass(frozen=True)
class Interruption:
    """One incarnation ended by a fault, a rollback or a requeue, and what it cost."""

    run: str
    attempt: int | None
    at: float  # when the supervisor knew (the first opening event)
    cause: Cause
    detection_s: float | None  # onset -> detected; None: not on record
    restart_s: float | None  # detected -> next attempt submitted; None: none submitted (yet)
    queue_s: float | None  # next attempt submitted -> running; None: not running (yet)
    lost_work_s: float | None  # work since the checkpoint the restart used; None: not on record
    lost_steps: int | None = None
    resume_step: int | None = None

    @property
    def recovery_s(self) -> float | None:
        """Detected -> the next attempt running."""
        if self.restart_s is None or self.queue_s is None:
            return None
        return self.restart_s + self.queue_s

    @property
    def onset(self) -> float:
        return self.at - (self.detection_s or 0.0)


@dataclass(frozen=True)
class CheckpointAdvice:
    """Young's interval sqrt(2·δ·M) for save cost δ and mean time between interruptions M."""

    interval_s: float | None
    save_s: float | None
    mtbi_s: float | None
    reason: str

    @property
    def expected_waste(self) -> float | None:
        """Share of time spent saving plus redoing work, δ/τ + τ/(2M), at that interval."""
        if self.interval_s is None or self.save_s is None or self.mtbi_s is None:
            return None
        return self.save_s / self.interval_s + self.interval_s / (2 * self.mtbi_s)


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
    def interruptions_per_day(self) -> float | None:
        return len(self.interruptions) / (self.wall_s / DAY_S) if self.wall_s > 0 else None

    @property
    def mtbi_s(self) -> float | None:
        """Mean running time between interruptions (None before the first one)."""
        return self.running_s / len(self.interruptions) if self.interruptions else None

    def advice(self, save_s: float | None) -> CheckpointAdvice:
        return checkpoint_advice(self.mtbi_s, save_s)


def checkpoint_advice(mtbi_s: float | None, save_s: float | None) -> CheckpointAdvice:
    if mtbi_s is None:
        return CheckpointAdvice(None, save_s, None, "no interruption observed yet: no rate to plan for")
    if save_s is None or save_s <= 0:
        return CheckpointAdvice(
            None, None, mtbi_s, "no checkpoint save time on record (evidence save_s); give the measured save cost"
        )
    tau = math.sqrt(2.0 * save_s * mtbi_s)
    return CheckpointAdvice(tau, save_s, mtbi_s, f"Young: sqrt(2 x {save_s:.0f} s x {mtbi_s:.0f} s)")


def measured_save_s(events: Iterable[Event], attempts: Iterable[AttemptRecord] = ()) -> float | None:
    """The median checkpoint save time on record (evidence ``save_s``/``write_s``, and what each
    attempt's log showed, so a run still in its first attempt has one too), or None."""
    values = [float(e.evidence[k]) for e in events for k in SAVE_KEYS if _number(e.evidence.get(k))]
    values = sorted(values or [a.save_s for a in attempts if a.save_s is not None])
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


# ---------------------------------------------------------------- interruptions


def interruptions(attempts: Sequence[AttemptRecord], events: Iterable[Event]) -> list[Interruption]:
    """One per attempt that a fault, rollback or requeue ended, oldest first."""
    by_attempt: dict[int | None, list[Event]] = {}
    for e in events:
        by_attempt.setdefault(e.attempt, []).append(e)
    seqs = sorted(a.seq for a in attempts)
    by_seq = {a.seq: a for a in attempts}
    out = []
    for seq, evs in by_attempt.items():
        opening = [e for e in evs if e.kind.value in OPENERS]
        if not opening:
            continue
        later = [s for s in seqs if seq is not None and s > seq]
        first_at = min(e.at for e in opening)
        incident = [e for e in evs if e.at >= first_at] + _restart_events(by_attempt, later)
        out.append(_interruption(opening, incident, by_seq.get(later[0]) if later else None))
    return sorted(out, key=lambda i: (i.at, i.attempt if i.attempt is not None else -1))


def _restart_events(by_attempt: Mapping[int | None, list[Event]], later: list[int]) -> list[Event]:
    """The next attempt's restart event: it names the checkpoint it resumed from."""
    if not later:
        return []
    return [e for e in by_attempt.get(later[0], []) if e.kind in (EventKind.RESTARTED, EventKind.SUBMITTED)]


def _interruption(opening: list[Event], incident: list[Event], nxt: AttemptRecord | None) -> Interruption:
    first = min(opening, key=lambda e: e.at)
    ev = _merged(incident)
    detection = _num(ev, "detection_s")
    if detection is None and any(k in first.evidence for k in ("silent_s",)):
        detection = _num(first.evidence, "silent_s")
    resume = _int(ev, "resume_step")
    lost_steps = _int(ev, "lost_steps")
    if lost_steps is None and resume is not None and _int(ev, "last_step") is not None:
        lost_steps = max(0, int(ev["last_step"]) - resume)
    step_time = _num(ev, "step_time_s")  # per step; a hang's step_interval_s is per log record
    lost_work = _num(ev, "lost_work_s")
    if lost_work is None and lost_steps is not None and step_time is not None:
        lost_work = lost_steps * step_time
    restart = queue = None
    if nxt is not None:
        restart = max(0.0, nxt.submitted_at - first.at)
        queue = max(0.0, nxt.started_at - nxt.submitted_at) if nxt.started_at is not None else None
    return Interruption(
        first.run, first.attempt, first.at, classify(opening), detection, restart, queue, lost_work, lost_steps, resume
    )


def _merged(events: list[Event]) -> dict[str, Any]:
    """Evidence of an incident's events, earliest first, later values filling in only what is missing."""
    out: dict[str, Any] = {}
    for e in sorted(events, key=lambda x: x.at):
        for k, v in e.evidence.items():
            out.setdefault(k, v)
    return out


def _number(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _num(ev: Mapping[str, Any], key: str) -> float | None:
    v = ev.get(key)
    return float(v) if _number(v) and v >= 0 else None


def _int(ev: Mapping[str, Any], key: str) -> int | None:
    v = ev.get(key)
    return int(v) if _number(v) else None


# ---------------------------------------------------------------- accounting


def goodput(
    run: str,
    attempts: Sequence[AttemptRecord],
    events: Sequence[Event],
    *,
    now: float,
    start: float | None = None,
    end: float | None = None,
) -> Goodput:
    """The run's goodput over [start, end] (default: first submission to the run's end, or ``now``)."""
    attempts = sorted((a for a in attempts if a.run == run), key=lambda a: a.seq)
    events = [e for e in events if e.run == run]
    run_end = _run_end(events, now)
    lo = start if start is not None else (attempts[0].submitted_at if attempts else run_end)
    hi = min(end if end is not None else run_end, now)
    found = interruptions(attempts, events)
    segments = [
        (a.started_at, a.ended_at if a.ended_at is not None else run_end) for a in attempts if a.started_at is not None
    ]
    claims = _claims(attempts, found, segments, run_end)
    productive, running, idle, lost, by_cause = sweep(lo, hi, segments, claims)
    inside = tuple(i for i in found if lo <= i.at < hi or (i.at == hi == run_end))
    notes = _notes(inside)
    return Goodput(run, lo, max(lo, hi), productive, running, idle, lost, by_cause, inside, notes)


def windows(
    run: str, attempts: Sequence[AttemptRecord], events: Sequence[Event], *, now: float, width_s: float = DAY_S
) -> list[Goodput]:
    """Goodput per consecutive window of ``width_s`` (a day by default) from the first submission."""
    if width_s <= 0:
        raise ValueError(f"window width must be positive, got {width_s}")
    whole = goodput(run, attempts, events, now=now)
    out, t = [], whole.start
    while t < whole.end:
        out.append(goodput(run, attempts, events, now=now, start=t, end=min(t + width_s, whole.end)))
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
) -> list[Claim]:
    claims: list[Claim] = []
    if attempts:
        a0 = attempts[0]
        claims.append(
            (a0.submitted_at, a0.started_at if a0.started_at is not None else run_end, "queue", "First start")
        )
    for i in found:
        cat = i.cause.category
        if i.detection_s:
            claims.append((i.onset, i.at, "detection", cat))
        if i.lost_work_s:
            claims += [(a, b, "rework", cat) for a, b in back_from(i.onset, i.lost_work_s, segments)]
        nxt = next((a for a in attempts if i.attempt is not None and a.seq > i.attempt), None)
        submitted = nxt.submitted_at if nxt is not None else run_end
        claims.append((i.at, submitted, "restart", cat))
        if nxt is not None:
            claims.append((nxt.submitted_at, nxt.started_at if nxt.started_at is not None else run_end, "queue", cat))
    return [c for c in claims if c[1] > c[0]]


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
