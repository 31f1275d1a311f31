"""The two statistical spike rules: the loss watch and the grad-norm watch.

Each keeps a rolling baseline of healthy records (records inside an open spike stay out of it),
opens a spike when a record's robust z and its jump over the median both pass their thresholds,
and decides the open spike later. Why a rolling median + MAD: see domain.spike_detector.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from supervisor.domain.spikes import (
    Notice,
    Peak,
    SpikeEvent,
    SpikeKind,
    SpikeOutcome,
    SpikeSettings,
    SpikeStatus,
    outcome,
    robust_stats,
)


@dataclass
class OpenSpike:
    """A spike waiting for its outcome: the band it must get back under, its peak so far, and how
    many consecutive records have been back in the band."""

    event: SpikeEvent
    band_hi: float
    peak_step: int
    peak_value: float
    in_band: int = 0

    def climb(self, value: float, step: int) -> bool:
        """Record ``value`` as the new peak if it is one; whether it was."""
        if value <= self.peak_value:
            return False
        self.peak_value, self.peak_step = value, step
        return True


class LossWatch:
    """The loss rules: a spike opens against the baseline, then heals, diverges or is not healed."""

    def __init__(self, settings: SpikeSettings) -> None:
        self.settings = settings
        self.spike: OpenSpike | None = None
        self._baseline: deque[float] = deque(maxlen=settings.window)
        self._prev: float | None = None
        self._rises = 0
        self._rise_start = 0

    def forget(self) -> None:
        """Drop the open spike and relearn the baseline (after a rollback outcome)."""
        self.spike = None
        self._baseline.clear()

    def check(self, loss: float, step: int) -> list[Notice]:
        self._count_rise(loss, step)
        if self.spike is None:
            return self._watch(loss, step)
        decided = self._judge(self.spike, loss, step)
        return [] if decided is None else [decided]

    def _count_rise(self, loss: float, step: int) -> None:
        if self._prev is not None and loss > self._prev:
            self._rises += 1
        else:
            self._rises = 0
            self._rise_start = step
        self._prev = loss

    def _watch(self, loss: float, step: int) -> list[Notice]:
        event = self._onset(loss, step) if len(self._baseline) >= self.settings.min_baseline else None
        if event is None:
            self._baseline.append(loss)
            return []
        return [event]

    def _onset(self, loss: float, step: int) -> SpikeEvent | None:
        s = self.settings
        median, sigma = robust_stats(list(self._baseline), s.rel_sigma_floor)
        z = (loss - median) / sigma
        if not (z >= s.spike_z and loss - median >= s.min_rel_jump * abs(median)):
            return None
        band = median + max(s.heal_band_z * sigma, s.heal_band_rel * abs(median))
        reason = (
            f"loss spike at step {step}: {loss:.4g} vs baseline median {median:.4g} "
            f"(robust sigma {sigma:.3g}, z {z:.1f}, +{(loss / median - 1) * 100:.0f}%)"
            if median
            else f"loss spike at step {step}: {loss:.4g} (z {z:.1f})"
        )
        event = SpikeEvent(SpikeKind.LOSS, step, loss, median, sigma, z, reason)
        self.spike = OpenSpike(event, band, step, loss)
        return event

    def _judge(self, spike: OpenSpike, loss: float, step: int) -> SpikeOutcome | None:
        ev = spike.event
        assert ev.baseline is not None and ev.sigma is not None
        new_high = spike.climb(loss, step)
        peak = Peak(spike.peak_step, spike.peak_value, (spike.peak_value - ev.baseline) / ev.sigma)
        if new_high and self._rises >= self.settings.diverge_rises and self._rise_span(step):
            self.forget()
            return self._diverged(ev, ev.baseline, loss, step, peak)
        if loss <= spike.band_hi:
            return self._back_in_band(spike, ev.baseline, loss, step, peak)
        spike.in_band = 0
        if step - ev.onset_step <= self.settings.heal_window_steps:
            return None
        self.forget()  # a new level: relearn the baseline rather than re-fire on it
        return self._not_healed(spike, ev.baseline, loss, step, peak)

    def _rise_span(self, step: int) -> bool:
        return step - self._rise_start >= self.settings.diverge_min_steps

    def _diverged(self, ev: SpikeEvent, baseline: float, loss: float, step: int, peak: Peak) -> SpikeOutcome:
        reason = (
            f"loss rose on {self._rises} consecutive records over {step - self._rise_start} steps (since step "
            f"{self._rise_start}), now {loss:.4g} vs baseline {baseline:.4g} (z {peak.z:.1f}) "
            f"→ roll back"
        )
        return outcome(ev, SpikeStatus.DIVERGED, "diverged", step, peak, reason)

    def _back_in_band(
        self, spike: OpenSpike, baseline: float, loss: float, step: int, peak: Peak
    ) -> SpikeOutcome | None:
        spike.in_band += 1
        if spike.in_band < self.settings.heal_confirm_records:
            return None
        self.spike = None
        reason = (
            f"loss back to {loss:.4g} (band ≤ {spike.band_hi:.4g} around baseline "
            f"{baseline:.4g}) {step - spike.event.onset_step} steps after onset, peak {peak.value:.4g} at "
            f"step {peak.step} (z {peak.z:.1f}); healed by itself → leave it"
        )
        return outcome(spike.event, SpikeStatus.HEALED, "healed", step, peak, reason)

    def _not_healed(self, spike: OpenSpike, baseline: float, loss: float, step: int, peak: Peak) -> SpikeOutcome:
        reason = (
            f"loss still {loss:.4g} at step {step}, {step - spike.event.onset_step} steps after onset (heal window "
            f"{self.settings.heal_window_steps}), above the band ≤ {spike.band_hi:.4g} around baseline "
            f"{baseline:.4g}; peak {peak.value:.4g} (z {peak.z:.1f}) → roll back"
        )
        return outcome(spike.event, SpikeStatus.NOT_HEALED, "not_healed", step, peak, reason)


class GradWatch:
    """The grad-norm rule, on log10: a spike opens against the baseline and is logged and left
    alone once back in band (the loss decides whether to roll back)."""

    def __init__(self, settings: SpikeSettings) -> None:
        self.settings = settings
        self.spike: OpenSpike | None = None
        self._baseline: deque[float] = deque(maxlen=settings.window)

    def check(self, g: float, step: int) -> list[Notice]:
        lg = math.log10(g)
        if self.spike is None:
            return self._watch(lg, g, step)
        decided = self._judge(self.spike, lg, g, step)
        return [] if decided is None else [decided]

    def _watch(self, lg: float, g: float, step: int) -> list[Notice]:
        event = self._onset(lg, g, step) if len(self._baseline) >= self.settings.min_baseline else None
        if event is None:
            self._baseline.append(lg)
            return []
        return [event]

    def _onset(self, lg: float, g: float, step: int) -> SpikeEvent | None:
        s = self.settings
        median, sigma = robust_stats(list(self._baseline), 0.0, s.grad_sigma_floor)
        z = (lg - median) / sigma
        if not (z >= s.grad_spike_z and lg - median >= math.log10(s.grad_min_ratio)):
            return None
        band = median + max(s.heal_band_z * sigma, math.log10(2.0))
        reason = (
            f"grad-norm spike at step {step}: {g:.4g} vs baseline median "
            f"{10**median:.4g} (x{g / 10**median:.0f}, z {z:.1f} on log10)"
        )
        event = SpikeEvent(SpikeKind.GRAD_NORM, step, g, 10**median, sigma, z, reason)
        self.spike = OpenSpike(event, band, step, g)
        return event

    def _judge(self, spike: OpenSpike, lg: float, g: float, step: int) -> SpikeOutcome | None:
        spike.climb(g, step)
        if lg > spike.band_hi:
            spike.in_band = 0
            return None
        spike.in_band += 1
        if spike.in_band < self.settings.heal_confirm_records:
            return None
        ev = spike.event
        assert ev.sigma is not None and ev.baseline is not None
        peak = Peak(
            spike.peak_step, spike.peak_value, (math.log10(spike.peak_value) - math.log10(ev.baseline)) / ev.sigma
        )
        self.spike = None
        reason = (
            f"grad norm back to {g:.4g} {step - ev.onset_step} steps after onset, peak "
            f"{peak.value:.4g} at step {peak.step}; the loss decides → leave it"
        )
        return outcome(ev, SpikeStatus.HEALED, "grad_norm_only", step, peak, reason)
