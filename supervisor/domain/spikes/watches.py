"""The two statistical spike rules: the loss watch and the grad-norm watch.

Each keeps a rolling baseline of healthy records (records inside an open spike stay out of it),
opens a spike when a record's robust z and its jump over the median both pass their thresholds,
and decides the open spike later. Why a rolling median + MAD: see domain.spikes.detector.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from supervisor.domain.spikes.events import (
    Notice,
    Peak,
    SpikeEvent,
    SpikeKind,
    SpikeOutcome,
    SpikeSettings,
    SpikeStatus,
    median_of_sorted,
    outcome,
    robust_stats,
)
from supervisor.domain.spikes.trajectory import Judgement, Trajectory


@dataclass
class OpenSpike:
    """A spike waiting for its outcome: the band it must get back under, its peak so far, and how
    many consecutive records have been back in the band."""

    event: SpikeEvent
    band_hi: float
    peak_step: int
    peak_value: float
    in_band: int = 0
    trajectory: Trajectory | None = None  # loss spikes: the records since the onset

    def climb(self, value: float, step: int) -> bool:
        """Record ``value`` as the new peak if it is one; whether it was."""
        if value <= self.peak_value:
            return False
        self.peak_value, self.peak_step = value, step
        return True


class LossWatch:
    """The loss rules: a spike opens against the baseline, then heals, diverges, settles on a
    plateau, shakes again, or is not healed (domain.spikes.trajectory says which, and when)."""

    def __init__(self, settings: SpikeSettings) -> None:
        self.settings = settings
        self.spike: OpenSpike | None = None
        self._baseline: deque[float] = deque(maxlen=settings.window)
        self._grad_baseline: deque[float] = deque(maxlen=settings.window)  # log10, of the same healthy records
        self._prev: float | None = None
        self._prev_step = 0
        self._rises = 0
        self._rise_start = 0
        self._rise_from = 0.0  # the loss where the current streak of rises began
        self._before: float | None = None  # the record before the current one
        self._before_step = 0

    def forget(self) -> None:
        """Drop the open spike and relearn the baseline (after a rollback outcome)."""
        self.spike = None
        self._baseline.clear()
        self._grad_baseline.clear()

    def check(self, loss: float, step: int, lgrad: float | None = None) -> list[Notice]:
        """The notices of one record; ``lgrad`` is its log10 grad norm where one was printed."""
        self._count_rise(loss, step)
        if self.spike is None:
            return self._watch(loss, step, lgrad)
        decided = self._judge(self.spike, loss, step, lgrad)
        return [] if decided is None else [decided]

    def _count_rise(self, loss: float, step: int) -> None:
        if self._prev is not None and loss > self._prev:
            self._rises += 1
        else:
            self._rises = 0
            self._rise_start, self._rise_from = step, loss
        self._before, self._before_step = self._prev, self._prev_step
        self._prev, self._prev_step = loss, step

    def _creep_or_restart(self, median: float, sigma: float) -> None:
        """At an onset: a streak of rises before it counts only if it crept up on two records or more
        by more than noise (two sigmas and ``heal_band_rel`` of the median) — a spike logged across
        two records (Megatron averages over the log interval) is no creep, nor are a few noisy
        records; otherwise the streak starts at the record before the onset."""
        least = max(2 * sigma, self.settings.heal_band_rel * abs(median))
        crept = self._rises - 1 >= 2 and self._before is not None and self._before - self._rise_from >= least
        if self._before is not None and not crept:
            self._rises = 1
            self._rise_start, self._rise_from = self._before_step, self._before

    def _watch(self, loss: float, step: int, lgrad: float | None) -> list[Notice]:
        event = self._onset(loss, step) if len(self._baseline) >= self.settings.min_baseline else None
        if event is None:
            self._baseline.append(loss)
            if lgrad is not None:
                self._grad_baseline.append(lgrad)
            return []
        return [event]

    def _onset(self, loss: float, step: int) -> SpikeEvent | None:
        s = self.settings
        median, sigma = robust_stats(self._baseline, s.rel_sigma_floor)
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
        self._creep_or_restart(median, sigma)
        jump = max(s.spike_z * sigma, s.min_rel_jump * abs(median))
        grad_ref = median_of_sorted(sorted(self._grad_baseline)) if self._grad_baseline else None
        self.spike = OpenSpike(event, band, step, loss, trajectory=Trajectory(s, step, loss, jump, band, grad_ref))
        return event

    def _judge(self, spike: OpenSpike, loss: float, step: int, lgrad: float | None) -> SpikeOutcome | None:
        ev, path = spike.event, spike.trajectory
        assert ev.baseline is not None and ev.sigma is not None and path is not None
        new_high = spike.climb(loss, step)
        path.add(step, loss, lgrad)
        peak = Peak(spike.peak_step, spike.peak_value, (spike.peak_value - ev.baseline) / ev.sigma)
        if new_high and self._rises >= self.settings.diverge_rises and self._rise_span(step):
            self.forget()
            return self._diverged(ev, ev.baseline, loss, step, peak)
        if loss <= spike.band_hi:
            return self._back_in_band(spike, ev.baseline, loss, step, peak)
        spike.in_band = 0
        if self.settings.early_decisions:
            return self._by_trajectory(spike, path, new_high, step, peak)
        if step - ev.onset_step <= self.settings.heal_window_steps:
            return None
        self.forget()  # a new level: relearn the baseline rather than re-fire on it
        return self._not_healed(spike, ev.baseline, loss, step, peak, Judgement(judged=False))

    def _by_trajectory(
        self, spike: OpenSpike, path: Trajectory, new_high: bool, step: int, peak: Peak
    ) -> SpikeOutcome | None:
        """Roll back as soon as the trajectory shows the spike will not heal; wait while it is
        returning, up to the cap; the fixed heal window for the rest."""
        ev, s = spike.event, self.settings
        assert ev.baseline is not None
        climb_z = path.climbing() if new_high else None
        if climb_z is not None:
            self.forget()
            return trajectory_outcome(ev, "trend", step, peak, path, Judgement(True, mann_kendall_z=climb_z))
        j = path.judge(step)
        rule = path.rollback_rule(j)
        elapsed = step - ev.onset_step
        out_of_time = elapsed > s.heal_cap or (elapsed > s.heal_window_steps and not j.returning)
        if rule is None and out_of_time:
            rule = "not_healed"
        if rule is None:
            return None
        self.forget()
        if rule == "not_healed":
            return self._not_healed(spike, ev.baseline, path.last_loss, step, peak, j)
        return trajectory_outcome(ev, rule, step, peak, path, j)

    def _rise_span(self, step: int) -> bool:
        return step - self._rise_start >= self.settings.diverge_min_steps

    def _diverged(self, ev: SpikeEvent, baseline: float, loss: float, step: int, peak: Peak) -> SpikeOutcome:
        reason = (
            f"loss rose on {self._rises} consecutive records over {step - self._rise_start} steps (since step "
            f"{self._rise_start}), now {loss:.4g} vs baseline {baseline:.4g} (z {peak.z:.1f}) "
            f"→ roll back"
        )
        figures = {"rises": self._rises, "rise_steps": step - self._rise_start, "loss": loss}
        return outcome(ev, SpikeStatus.DIVERGED, "diverged", step, peak, reason, figures)

    def _back_in_band(
        self, spike: OpenSpike, baseline: float, loss: float, step: int, peak: Peak
    ) -> SpikeOutcome | None:
        spike.in_band += 1
        if spike.in_band < self.settings.heal_confirm_records:
            return None
        self.spike = None
        shocks = spike.trajectory.aftershocks if spike.trajectory else []
        reason = (
            f"loss back to {loss:.4g} (band ≤ {spike.band_hi:.4g} around baseline "
            f"{baseline:.4g}) {step - spike.event.onset_step} steps after onset, peak {peak.value:.4g} at "
            f"step {peak.step} (z {peak.z:.1f}){aftershock_text(shocks)}; healed by itself → leave it"
        )
        figures = {"loss": loss, "band_hi": spike.band_hi, "aftershocks": len(shocks)}
        return outcome(spike.event, SpikeStatus.HEALED, "healed", step, peak, reason, figures)

    def _not_healed(
        self, spike: OpenSpike, baseline: float, loss: float, step: int, peak: Peak, j: Judgement
    ) -> SpikeOutcome:
        elapsed = step - spike.event.onset_step
        limit = (
            f"still returning but past the cap of {self.settings.heal_cap} steps"
            if j.returning
            else f"heal window {self.settings.heal_window_steps}"
        )
        reason = (
            f"loss still {loss:.4g} at step {step}, {elapsed} steps after onset ({limit}), above the band "
            f"≤ {spike.band_hi:.4g} around baseline {baseline:.4g}; peak {peak.value:.4g} (z {peak.z:.1f}) → roll back"
        )
        figures = {"loss": loss, "band_hi": spike.band_hi, **(j.figures(baseline) if j.judged else {})}
        return outcome(spike.event, SpikeStatus.NOT_HEALED, "not_healed", step, peak, reason, figures)


def aftershock_text(shocks: list[tuple[int, float]]) -> str:
    if not shocks:
        return ""
    where = ", ".join(f"{v:.4g}@{s}" for s, v in shocks[:5])
    return f", {len(shocks)} aftershock(s) ({where})"


def trajectory_outcome(
    ev: SpikeEvent, rule: str, step: int, peak: Peak, path: Trajectory, j: Judgement
) -> SpikeOutcome:
    """The ROLLBACK outcome of a trajectory rule (``plateau``, ``aftershock``, ``trend``), with its
    figures and a reason that says which rule fired on what."""
    assert ev.baseline is not None
    figures = {**j.figures(ev.baseline), "band_hi": path.band_hi, "aftershocks": len(path.aftershocks)}
    elapsed = step - ev.onset_step
    if rule == "trend":
        why = (
            f"loss kept climbing after the spike at step {ev.onset_step}: new high {peak.value:.4g} at step {step}, "
            f"Mann-Kendall z {j.mann_kendall_z:.1f} over the last {len(path)} records → roll back"
        )
        figures = {"mann_kendall_z": round(j.mann_kendall_z, 2), "records": len(path)}
        return outcome(ev, SpikeStatus.DIVERGED, rule, step, peak, why, figures)
    grad = f", grad norm x{j.grad_ratio:.3g} its pre-spike median" if j.grad_ratio is not None else ""
    why = (
        f"loss settled at {j.level:.4g} ({figures['level_pct']:+}% over baseline {ev.baseline:.4g}, band ≤ "
        f"{path.band_hi:.4g}) {elapsed} steps after onset and is not coming down (Mann-Kendall z "
        f"{j.mann_kendall_z:.1f} over {j.records} records, slope {j.slope * 100:+.3g}/100 steps){grad}"
        f"{aftershock_text(path.aftershocks)}; peak {peak.value:.4g} at step {peak.step} → roll back ({rule})"
    )
    return outcome(ev, SpikeStatus.NOT_HEALED, rule, step, peak, why, figures)


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
        median, sigma = robust_stats(self._baseline, 0.0, s.grad_sigma_floor)
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
