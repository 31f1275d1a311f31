"""Divergence without a jump: a steady climb of the loss (and of the grad norm) against the run's own
recent history.

The jump rules (domain.spikes.watches) compare one record with a rolling median; a loss that climbs a
little on every record drags that median along and is never "a spike" (a climb from 1.58 to over 3
across ~150 steps, grad norm rising ten-fold, passed unseen). :class:`TrendWatch` keeps the last
``trend_history`` healthy records and splits them: the older part is the *reference* (its median and
robust sigma), the newest ``trend_window`` records the *window*. A trend is declared when

* the window rises significantly: Mann-Kendall z >= ``trend_z`` (a rank test: it does not care how
  noisy or heavy-tailed the loss is, only whether later records keep being higher), and
* the newest level (median of the last three records, so one noisy record cannot do it) stands
  ``trend_min_rise`` above the reference and ``trend_rise_z`` reference sigmas above it — or a
  smaller ``trend_min_rise_grad`` (and two sigmas) while the grad norm climbs significantly too, to
  ``grad_trend_ratio`` times its reference.

The trend began where the loss last stood at the reference level (the last record at or below
the reference median): that is the onset handed to the rollback policy, so the checkpoint
chosen lies before the climb, and the decision latency is counted from there. The rank test runs
over the records since then (at least ``trend_min_records``): a long flat stretch before the climb
would only dilute it.

Cost: the medians are taken on at most ``trend_history`` floats per record and the rank test
(O(window²), numpy) runs only once the level has risen enough, so a healthy run pays a few
microseconds per record whatever its length.
"""

from __future__ import annotations

import math
from collections import deque
from itertools import islice

import numpy as np
import numpy.typing as npt

from supervisor.domain.spikes.events import (
    Notice,
    Peak,
    SpikeEvent,
    SpikeKind,
    SpikeSettings,
    SpikeStatus,
    median_of_sorted,
    outcome,
    robust_stats,
)

Floats = npt.NDArray[np.float64]
_RECENT = 3  # records whose median is "the level now"
_GRAD_PATH_SIGMAS = 2.0  # with the grad norm climbing too, the loss need only clear its noise


def mann_kendall_z(values: Floats) -> float:
    """Mann-Kendall trend statistic of ``values`` in order, as a z score (positive: rising), with
    the continuity correction; 0.0 for fewer than three values. Ties count as neither."""
    n = len(values)
    if n < 3:
        return 0.0
    signs = np.sign(values[None, :] - values[:, None])
    s = float(np.triu(signs, 1).sum())
    var = n * (n - 1) * (2 * n + 5) / 18.0
    if s == 0:
        return 0.0
    return (s - math.copysign(1.0, s)) / math.sqrt(var)


def theil_sen_slope(x: Floats, y: Floats) -> float:
    """Median of the pairwise slopes of ``y`` over ``x`` (robust to outliers); 0.0 when no two
    ``x`` differ."""
    dx = x[None, :] - x[:, None]
    dy = y[None, :] - y[:, None]
    upper = np.triu(np.ones(dx.shape, dtype=bool), 1) & (dx != 0)
    if not upper.any():
        return 0.0
    return float(np.median(dy[upper] / dx[upper]))


class TrendWatch:
    """The trend rule over healthy records (records inside an open spike are never fed here)."""

    def __init__(self, settings: SpikeSettings) -> None:
        self.settings = settings
        size = settings.trend_history
        self._steps: deque[int] = deque(maxlen=size)
        self._loss: deque[float] = deque(maxlen=size)
        self._lgrad: deque[float] = deque(maxlen=size)  # log10 grad norm, NaN where none was printed

    def forget(self) -> None:
        """Relearn from the next record on (after any rollback outcome)."""
        self._steps.clear()
        self._loss.clear()
        self._lgrad.clear()

    def check(self, loss: float, lgrad: float | None, step: int) -> list[Notice]:
        self._steps.append(step)
        self._loss.append(loss)
        self._lgrad.append(math.nan if lgrad is None else lgrad)
        s = self.settings
        n = len(self._loss)
        if n < 2 * s.trend_min_records:
            return []
        w = min(s.trend_window, n - s.trend_min_records)
        ref_median, ref_sigma = robust_stats(islice(self._loss, n - w), s.rel_sigma_floor)
        level = median_of_sorted(sorted(islice(self._loss, n - _RECENT, n)))
        rise = level - ref_median
        if rise < s.trend_min_rise_grad * abs(ref_median) or rise < _GRAD_PATH_SIGMAS * ref_sigma:
            return []  # the common case, in plain Python: no rise worth a rank test
        losses = np.fromiter(self._loss, dtype=np.float64, count=n)
        return self._test(losses, w, ref_median, ref_sigma, level)

    def _test(self, losses: Floats, w: int, ref_median: float, ref_sigma: float, level: float) -> list[Notice]:
        """The rank test over the records since the climb began (one at the reference level first,
        at least ``trend_min_records``, at most the window): a long flat stretch before a climb
        must not dilute it."""
        s = self.settings
        n = len(losses)
        began = self._began(losses, ref_median)
        k = min(w, max(s.trend_min_records, n - began + 1))
        mk = mann_kendall_z(losses[-k:])
        if mk < s.trend_z:
            return []
        rel = (level - ref_median) / abs(ref_median) if ref_median else math.inf
        grad = self._grad_trend(w, k)
        by_loss = rel >= s.trend_min_rise and level - ref_median >= s.trend_rise_z * ref_sigma
        by_grad = grad is not None and grad[0] >= s.grad_trend_ratio and grad[1] >= s.trend_z
        if not (by_loss or by_grad):
            return []
        return self._declare(losses, k, began, ref_median, ref_sigma, level, mk, grad)

    def _grad_trend(self, w: int, k: int) -> tuple[float, float] | None:
        """(newest grad level / reference grad level, Mann-Kendall z of the last ``k`` records) on
        log10, the reference being the records before the window ``w``; None without enough grad
        norms printed."""
        lg = np.fromiter(self._lgrad, dtype=np.float64, count=len(self._lgrad))
        ref, window = lg[:-w], lg[-k:]
        ref, window = ref[np.isfinite(ref)], window[np.isfinite(window)]
        if len(ref) < _RECENT or len(window) < self.settings.trend_min_records:
            return None
        ratio = 10 ** (float(np.median(window[-_RECENT:])) - float(np.median(ref)))
        return ratio, mann_kendall_z(window)

    @staticmethod
    def _began(losses: Floats, at_reference: float) -> int:
        """Index of the first record after the last one at the reference level (where the climb
        began)."""
        below = np.flatnonzero(losses <= at_reference)
        return min(int(below[-1]) + 1 if len(below) else 0, len(losses) - 1)

    def _declare(
        self,
        losses: Floats,
        k: int,
        began: int,
        ref_median: float,
        ref_sigma: float,
        level: float,
        mk: float,
        grad: tuple[float, float] | None,
    ) -> list[Notice]:
        steps = np.fromiter(self._steps, dtype=np.float64, count=len(self._steps))
        onset, step = int(steps[began]), int(steps[-1])
        slope = theil_sen_slope(steps[-k:], losses[-k:])
        figures: dict[str, float | int | str] = {
            "reference": round(ref_median, 6),
            "level": round(level, 6),
            "rise_pct": round((level / ref_median - 1) * 100, 2) if ref_median else math.inf,
            "rise_sigmas": round((level - ref_median) / ref_sigma, 2),
            "mann_kendall_z": round(mk, 2),
            "slope_per_100_steps": round(slope * 100, 6),
            "window_records": k,
            "window_steps": int(steps[-1] - steps[-k]),
        }
        grad_text = ""
        if grad is not None:
            figures.update(grad_ratio=round(grad[0], 3), grad_mann_kendall_z=round(grad[1], 2))
            grad_text = f"; grad norm x{grad[0]:.3g} its reference (Mann-Kendall z {grad[1]:.1f})"
        why = (
            f"loss climbing since step {onset}: now {level:.4g} vs reference {ref_median:.4g} "
            f"(+{figures['rise_pct']}%, {figures['rise_sigmas']} sigma), Mann-Kendall z {mk:.1f} over the last "
            f"{k} records ({figures['window_steps']} steps), slope {slope * 100:+.3g}/100 steps{grad_text}"
        )
        event = SpikeEvent(SpikeKind.TREND, onset, level, ref_median, ref_sigma, (level - ref_median) / ref_sigma, why)
        self.forget()
        peak = Peak(step, level, event.severity_z)
        return [event, outcome(event, SpikeStatus.DIVERGED, "trend", step, peak, why + " → roll back", figures)]
