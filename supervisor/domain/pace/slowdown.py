"""A job's throughput against its own baseline since its last start.

:class:`SlowdownDetector` learns a baseline after each start: the median of the first
``baseline_steps`` steps after ``warmup`` steps. It flags when the median of the last ``window``
steps is at least ``drop`` below the baseline for ``sustain`` consecutive steps, so a brief dip
(shorter than half the window) cannot flag. The straggler that explains a slowdown, when the log
carries per-rank times, is ``domain/pace/stragglers.py``'s.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np


class SlowdownState(enum.Enum):
    LEARNING = "learning"  # baseline not learnt yet
    NORMAL = "normal"
    SLOW = "slow"  # recent median below the baseline by at least `drop`, sustained


@dataclass(frozen=True)
class SlowdownVerdict:
    state: SlowdownState
    baseline: float | None  # throughput, median of the baseline steps
    recent: float | None  # throughput, median of the last `window` steps
    drop: float | None  # 1 - recent / baseline
    steps_below: int  # consecutive steps with recent <= baseline * (1 - drop threshold)
    reason: str


class SlowdownDetector:
    """A job's throughput (e.g. tokens/s, TFLOPs) against its own baseline since the last start."""

    def __init__(
        self,
        drop: float = 0.03,
        warmup: int = 5,
        baseline_steps: int = 50,
        window: int = 30,
        sustain: int = 10,
    ) -> None:
        if not 0 < drop < 1 or warmup < 0 or baseline_steps < 1 or window < 1 or sustain < 1:
            raise ValueError("need 0 < drop < 1, warmup >= 0 and positive baseline_steps, window, sustain")
        self.drop, self.warmup, self.sustain = drop, warmup, sustain
        self._base = np.full(baseline_steps, np.nan)
        self._recent = np.full(window, np.nan)
        self.reset()

    def reset(self) -> None:
        """Forget the baseline, e.g. after a restart (new nodes, new throughput)."""
        self._base.fill(np.nan)
        self._recent.fill(np.nan)
        self.seen = 0  # valid values since reset
        self._n_recent = 0
        self.baseline: float | None = None
        self.below = 0

    def update(self, throughput: float) -> SlowdownVerdict:
        """Feed one step's throughput (higher is better); NaN, inf and values <= 0 are ignored."""
        if not (np.isfinite(throughput) and throughput > 0):
            return self.verdict()
        self.seen += 1
        i = self.seen - 1 - self.warmup
        if i < 0:
            return self.verdict()
        if self.baseline is None:
            self._base[i] = throughput
            if i + 1 == self._base.size:
                self.baseline = float(np.median(self._base))
            return self.verdict()
        self._recent[self._n_recent % self._recent.size] = throughput
        self._n_recent += 1
        recent = self._recent_median()  # once per step: the verdict reads it too
        if self._n_recent >= self._recent.size and recent <= self.baseline * (1 - self.drop):
            self.below += 1
        else:
            self.below = 0
        return self.verdict(recent)

    def _recent_median(self) -> float:
        return float(np.median(self._recent[: min(self._n_recent, self._recent.size)]))

    def verdict(self, recent: float | None = None) -> SlowdownVerdict:
        """``recent``: the median of the last steps when the caller has it already."""
        if self.baseline is None or self._n_recent == 0:
            return SlowdownVerdict(SlowdownState.LEARNING, self.baseline, None, None, 0, "learning the baseline")
        recent = self._recent_median() if recent is None else recent
        drop = 1 - recent / self.baseline
        slow = self.below >= self.sustain
        reason = (
            f"throughput {recent:.4g} (median of last {min(self._n_recent, self._recent.size)} steps) is "
            f"{100 * drop:.1f}% below the baseline {self.baseline:.4g}" + (f", for {self.below} steps" if slow else "")
        )
        state = SlowdownState.SLOW if slow else SlowdownState.NORMAL
        return SlowdownVerdict(state, self.baseline, recent, drop, self.below, reason)
