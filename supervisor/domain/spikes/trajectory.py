"""What an open loss spike does after its peak, and what that says: heal, or roll back now.

A fixed heal window decides too late in both directions: a spike that settles on an elevated
plateau (+10-15 % over the pre-spike level, grad norm several times its baseline, aftershocks) is
"inside the heal window" for all of it, while the people who ran such models rolled back long
before; and a spike that heals as slowly as BLOOM-13B's (~500 steps) is rolled back by a window
short enough for the first. So the spike is judged by its trajectory once it has settled
(``settle_steps`` and ``settle_records`` after the peak):

* **returning** — the records of the second half of the time since the peak (at least the last
  ``settle_steps``, at least ``settle_records`` records) come down: Mann-Kendall z <= -``return_z``, and at its Theil-Sen slope the level (median of the last
  three records) reaches the heal band before ``heal_cap`` steps after the onset. It is left alone,
  however long that takes within the cap.
* **plateau** — not returning, above the band, with the grad norm at ``grad_elevated_ratio`` times
  its pre-spike median or more → roll back now.
* **aftershock** — not returning, above the band, after a further spike since the onset (the loss
  jumped again by the onset's own criterion after coming down by as much) → roll back now.
* otherwise the fixed ``heal_window_steps`` still decides a spike that is not returning (as before:
  roll back when it runs out), and ``heal_cap`` one that is.

Rank tests and medians (not means and least squares) because a loss series has heavy tails and the
spike itself is the biggest outlier. The records kept are bounded (thinned to every other one past
``2 x trend_window``, so they still span the whole spike), so judging a record is O(1) in the
length of the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from supervisor.domain.spikes.divergence import mann_kendall_z, theil_sen_slope
from supervisor.domain.spikes.events import SpikeSettings, median_of_sorted

_RECENT = 3  # records whose median is "the level now"


@dataclass(frozen=True)
class Judgement:
    """The trajectory at one record: whether it could be judged yet and, if so, the figures."""

    judged: bool
    returning: bool = False
    level: float = math.nan
    mann_kendall_z: float = 0.0
    slope: float = 0.0  # loss per step over the recent records
    projected_steps: float = math.inf  # steps until the level is back in band at that slope
    grad_ratio: float | None = None  # recent grad norm / pre-spike median
    records: int = 0

    def figures(self, baseline: float) -> dict[str, float | int | str]:
        out: dict[str, float | int | str] = {
            "level": round(self.level, 6),
            "level_pct": round((self.level / baseline - 1) * 100, 2) if baseline else math.inf,
            "mann_kendall_z": round(self.mann_kendall_z, 2),
            "slope_per_100_steps": round(self.slope * 100, 6),
            "projected_steps": round(self.projected_steps, 1) if math.isfinite(self.projected_steps) else "never",
            "records": self.records,
        }
        if self.grad_ratio is not None:
            out["grad_ratio"] = round(self.grad_ratio, 3)
        return out


class Trajectory:
    """The records of an open loss spike since its onset (bounded), its peak and its aftershocks."""

    def __init__(
        self, settings: SpikeSettings, onset: int, value: float, jump: float, band_hi: float, grad_ref: float | None
    ) -> None:
        self.settings = settings
        self.onset = onset
        self.band_hi = band_hi
        self.jump = jump  # the rise that opened the spike's kind of jump: baseline * min_rel_jump or z sigmas
        self.grad_ref = grad_ref  # log10 of the pre-spike grad-norm median, if grad norms were printed
        self.peak_step, self.peak_value = onset, value
        self.aftershocks: list[tuple[int, float]] = []
        self._shock, self._low = value, value
        self._steps: list[int] = [onset]
        self._loss: list[float] = [value]
        self._lgrad: list[float] = [math.nan]

    def __len__(self) -> int:
        """Records kept (the newest ``trend_window`` since the onset)."""
        return len(self._loss)

    @property
    def last_loss(self) -> float:
        return self._loss[-1]

    def add(self, step: int, loss: float, lgrad: float | None) -> bool:
        """Record one more record; whether it is the spike's new high."""
        self._steps.append(step)
        self._loss.append(loss)
        self._lgrad.append(math.nan if lgrad is None else lgrad)
        if len(self._steps) > 2 * self.settings.trend_window:
            self._thin()
        if self._low <= self._shock - self.jump and loss >= self._low + self.jump:
            self.aftershocks.append((step, loss))
            self._shock = self._low = loss
        self._low = min(self._low, loss)
        if loss <= self.peak_value:
            return False
        self.peak_step, self.peak_value = step, loss
        return True

    def _thin(self) -> None:
        """Keep every other record, the newest always: the records still span the whole spike (a
        slow heal is judged over its second half), in bounded memory, O(1) amortised."""
        keep = slice((len(self._steps) - 1) % 2, None, 2)
        self._steps, self._loss, self._lgrad = self._steps[keep], self._loss[keep], self._lgrad[keep]

    def climbing(self) -> float | None:
        """Mann-Kendall z of every kept record since the onset when they rise significantly (a
        divergence inside the spike), else None."""
        s = self.settings
        if len(self._loss) < s.trend_min_records:
            return None
        z = mann_kendall_z(np.fromiter(self._loss, dtype=np.float64, count=len(self._loss)))
        return z if z >= s.trend_z else None

    def judge(self, step: int) -> Judgement:
        s = self.settings
        steps = np.fromiter(self._steps, dtype=np.float64, count=len(self._steps))
        after = steps > self.peak_step
        if int(after.sum()) < s.settle_records or step - self.peak_step < s.settle_steps:
            return Judgement(judged=False)
        # the second half of the time since the peak (at least settle_steps): the fall is over by then
        since = step - max(s.settle_steps, (step - self.peak_step) / 2)
        n = max(s.settle_records, int((steps >= since).sum()))
        x = steps[-n:]
        y = np.fromiter(self._loss, dtype=np.float64, count=len(self._loss))[-n:]
        level = median_of_sorted(sorted(self._loss[-_RECENT:]))
        mk = mann_kendall_z(y)
        slope = theil_sen_slope(x, y)
        projected = (level - self.band_hi) / -slope if slope < 0 else math.inf
        remaining = s.heal_cap - (step - self.onset)
        returning = mk <= -s.return_z and projected <= remaining
        return Judgement(True, returning, level, mk, slope, max(projected, 0.0), self._grad_ratio(n), n)

    def _grad_ratio(self, n: int) -> float | None:
        if self.grad_ref is None:
            return None
        lg = [v for v in self._lgrad[-n:] if math.isfinite(v)]
        if len(lg) < _RECENT:
            return None
        return float(10 ** (median_of_sorted(sorted(lg[-_RECENT:])) - self.grad_ref))

    def rollback_rule(self, j: Judgement) -> str | None:
        """``plateau`` or ``aftershock`` when the judgement calls for a rollback now, else None."""
        if not j.judged or j.returning or j.level <= self.band_hi:
            return None
        if j.grad_ratio is not None and j.grad_ratio >= self.settings.grad_elevated_ratio:
            return "plateau"
        return "aftershock" if self.aftershocks else None
