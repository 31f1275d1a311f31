"""One interruption of a run and what it cost, and the readers of an incident's evidence that
both the resubmission path (goodput) and in-allocation swaps (goodput_swaps) use. Pure."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from supervisor.domain.goodput.causes import Cause
from supervisor.domain.records import AttemptRecord, Event

# Event kinds that open an interruption: ours, and those other issues add (matched by value, so an
# older store without them still loads).
OPENERS = frozenset({"fault", "requeued", "rollback", "hang", "mass_fault"})


@dataclass(frozen=True)
class Interruption:
    """One incarnation ended by a fault, a rollback or a requeue — or, in-allocation, one step
    relaunched on a hot spare within the same job (``in_allocation``) — and what it cost."""

    run: str
    attempt: int | None
    at: float  # when the supervisor knew (the first opening event)
    cause: Cause
    detection_s: float | None  # onset -> detected; None: not on record
    # detected -> next attempt submitted (+ its start-up to the first step after the resume);
    # a swap: detected -> the step's first training step after the resume. None: not (yet)
    restart_s: float | None
    queue_s: float | None  # next attempt submitted -> running (a swap: 0); None: not running (yet)
    lost_work_s: float | None  # work since the checkpoint the restart used; None: not on record
    lost_steps: int | None = None
    resume_step: int | None = None
    in_allocation: bool = False  # a swap inside the job: no new job, no queue

    @property
    def recovery_s(self) -> float | None:
        """Detected -> the next attempt running (a swap: the step computing again)."""
        if self.restart_s is None or self.queue_s is None:
            return None
        return self.restart_s + self.queue_s

    @property
    def onset(self) -> float:
        return self.at - (self.detection_s or 0.0)


def detection(ev: Mapping[str, Any], first: Event, failed: AttemptRecord | None) -> float | None:
    """Onset to detection: the evidence's ``detection_s``, a hang's silence, else the time from
    the job's end (Slurm's, when it ended by itself before the supervisor knew)."""
    found = num(ev, "detection_s")
    if found is None and "silent_s" in first.evidence:
        found = num(first.evidence, "silent_s")
    if found is None and failed is not None and failed.ended_at is not None and failed.ended_at < first.at:
        found = first.at - failed.ended_at
    return found


def merged(events: list[Event]) -> dict[str, Any]:
    """Evidence of an incident's events, earliest first, later values filling in only what is missing."""
    out: dict[str, Any] = {}
    for e in sorted(events, key=lambda x: x.at):
        for k, v in e.evidence.items():
            out.setdefault(k, v)
    return out


def _number(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def num(ev: Mapping[str, Any], key: str) -> float | None:
    v = ev.get(key)
    return float(v) if _number(v) and v >= 0 else None


def int_of(ev: Mapping[str, Any], key: str) -> int | None:
    v = ev.get(key)
    return int(v) if _number(v) else None
