"""In-allocation swaps in the goodput account (issue 16 item 3, docs/logbook.md).

A swap is an interruption like a restart, read from the same kind of evidence: the fault events
that the tick deciding the swap wrote (detection), the ``swap`` note (the resume step, the nodes
out and in), the ``resumed`` note (the new generation running) and the progress series (the
last step before the fault, the first step after the resume). Its restart runs from the fault to
the step's first training step after the resume; there is no queue. The job never left, so the
attempt goes on: the swap's events are taken out of the attempt's ordinary (resubmission) account.

The hot spares' cost: the nodes a job held beyond the run's ``nodes`` while they did not train
(a spare that took a dead node's place trains from its swap on), against the time the swaps took
and what the run's resubmissions took. Pure.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from supervisor.domain.goodput.causes import classify
from supervisor.domain.goodput.interruption import OPENERS, Interruption, detection, int_of, merged, num
from supervisor.domain.progress.series import ProgressPoint
from supervisor.domain.records import AttemptRecord, Event, EventKind


@dataclass(frozen=True)
class SpareEconomics:
    """What the hot spares cost (idle node-seconds) and what the swaps saved against resubmissions."""

    idle_spare_node_s: float
    swaps: int
    swap_recovery_s: float | None  # mean, detected -> the step computing again (None: none on record)
    resubmissions: int
    resubmit_recovery_s: float | None  # mean, detected -> the next attempt running (None: none on record)

    @property
    def saved_s(self) -> float | None:
        """The swaps' time against as many resubmissions of this run (None: nothing to compare with)."""
        if self.swap_recovery_s is None or self.resubmit_recovery_s is None:
            return None
        return self.swaps * (self.resubmit_recovery_s - self.swap_recovery_s)


def note_of(e: Event, what: str) -> bool:
    """An in-allocation logbook note: ``swap`` or ``resumed`` (domain/decide/in_allocation.py)."""
    return e.kind is EventKind.NOTE and e.evidence.get("in_allocation") == what


def swap_interruptions(
    events: Sequence[Event], series: Sequence[ProgressPoint] | None, pace: float | None
) -> tuple[list[Interruption], frozenset[str]]:
    """One interruption per swap, and the keys of the events booked to swaps (the faults the swap
    answered, its notes) for the ordinary account to leave out."""
    swaps = sorted((e for e in events if note_of(e, "swap")), key=lambda e: e.at)
    resumed: dict[tuple[int | None, object], Event] = {}
    for e in sorted((e for e in events if note_of(e, "resumed")), key=lambda e: e.at):
        resumed.setdefault((e.attempt, e.evidence.get("generation")), e)
    restored = {(e.attempt, e.evidence.get("generation")): e for e in events if note_of(e, "memory_restored")}
    taken = {e.key for e in events if note_of(e, "resumed") or note_of(e, "memory_restored")}
    since: dict[int | None, float] = {}
    out = []
    for s in swaps:
        faults = [
            e
            for e in events
            if e.attempt == s.attempt and e.kind.value in OPENERS and since.get(s.attempt, -1.0) < e.at <= s.at
        ]
        since[s.attempt] = s.at
        taken |= {s.key, *(e.key for e in faults)}
        points = [p for p in series or () if p.attempt == s.attempt]
        again = resumed.get((s.attempt, s.evidence.get("generation")))
        memory = restored.get((s.attempt, s.evidence.get("generation")))
        out.append(_swap(s, faults or [s], again, points, pace, memory))
    return out, frozenset(taken)


def _swap(
    s: Event,
    opening: list[Event],
    again: Event | None,
    points: Sequence[ProgressPoint],
    pace: float | None,
    memory: Event | None = None,
) -> Interruption:
    """``memory``: the relaunched step's note that it restored a newer generation from peer
    copies (the step it resumed from is that one's, not the plan's checkpoint)."""
    first = min(opening, key=lambda e: e.at)
    ev = merged([*opening, s])
    resume = int_of((memory or s).evidence, "resume_step")
    back = _computing_again(again, points, resume, pace)
    before = [p.step for p in points if p.at <= first.at]
    last = max(before) if before else int_of(ev, "last_step")
    lost_steps = max(0, last - resume) if last is not None and resume is not None else None
    step_time = pace if pace is not None else num(ev, "step_time_s")
    lost_work = lost_steps * step_time if lost_steps is not None and step_time is not None else None
    restart = max(0.0, back - first.at) if back is not None else None
    cause = classify([e for e in opening if e is not s] or opening)
    return Interruption(
        s.run, s.attempt, first.at, cause, detection(ev, first, None), restart, 0.0, lost_work, lost_steps, resume, True
    )


def _computing_again(
    again: Event | None, points: Sequence[ProgressPoint], resume: int | None, pace: float | None
) -> float | None:
    """When the relaunched step began its first training step after the resume: the first step
    read since it ran, less the steps it reports since the resume at the run's pace; without a
    step read yet, when the launcher said the new generation runs (None: not yet)."""
    if again is None:
        return None
    after = [p for p in points if p.at >= again.at and (resume is None or p.step > resume)]
    if not after or resume is None or pace is None:
        return again.at
    first = min(after, key=lambda p: (p.at, p.step))
    return max(again.at, first.at - (first.step - resume) * pace)


def spare_economics(
    attempts: Sequence[AttemptRecord],
    events: Sequence[Event],
    found: Sequence[Interruption],
    run_nodes: int | None,
    end: float,
) -> SpareEconomics | None:
    """None when no job of the run held a hot spare and no swap is on record."""
    swaps = [e for e in events if note_of(e, "swap")]
    nodes = run_nodes if run_nodes is not None else _step_size(swaps)
    idle = sum(_idle_s(a, [e for e in swaps if e.attempt == a.seq], nodes, end) for a in attempts) if nodes else 0.0
    booked = [i for i in found if i.in_allocation]
    if idle <= 0 and not booked:
        return None
    resubmits = [i for i in found if not i.in_allocation]
    return SpareEconomics(
        idle, len(booked), _mean(i.recovery_s for i in booked), len(resubmits), _mean(i.recovery_s for i in resubmits)
    )


def _step_size(swaps: Iterable[Event]) -> int | None:
    """The run's node count as its swaps' step nodes say (when the run's spec is not at hand)."""
    sizes = [len(e.evidence["nodes"]) for e in swaps if isinstance(e.evidence.get("nodes"), list)]
    return max(sizes) if sizes else None


def _idle_s(a: AttemptRecord, swaps: Sequence[Event], nodes: int, end: float) -> float:
    """Node-seconds the attempt's job held spares that did not train: each swap puts spares to work."""
    if a.started_at is None:
        return 0.0
    stop = min(a.ended_at if a.ended_at is not None else end, end)
    spares, t, idle = max(0, len(a.nodes) - nodes), a.started_at, 0.0
    for s in sorted(swaps, key=lambda e: e.at):
        if not a.started_at <= s.at <= stop:
            continue
        idle += spares * (s.at - t)
        into = s.evidence.get("into")
        spares, t = max(0, spares - (len(into) if isinstance(into, list) else 1)), s.at
    return idle + spares * max(0.0, stop - t)


def _mean(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None
