"""Checkpoint advice from goodput's figures: Young's interval, and the save cost on record. Pure."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from supervisor.domain.records import AttemptRecord, Event

SAVE_KEYS = ("save_s", "write_s")  # evidence of a checkpoint save's duration


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


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
