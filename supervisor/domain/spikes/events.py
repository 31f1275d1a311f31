"""What loss-spike detection says: the detector's settings, the events and outcomes it reports,
and the leave-it / roll-back decision over them.

Pure domain: no I/O, no clock. The detector that produces these values, and the reasoning behind
its rules and defaults, is :mod:`supervisor.domain.spikes.detector`; the rollback policy that acts
on a ROLLBACK outcome is :mod:`supervisor.domain.spikes.rollback`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

_MAD_TO_SIGMA = 1.4826


class SpikeKind(str, Enum):
    LOSS = "loss"
    GRAD_NORM = "grad_norm"
    NONFINITE = "nonfinite"
    LOSS_SCALE = "loss_scale"
    TREND = "trend"  # a steady climb of the loss (and grad norm) with no single jump


class SpikeStatus(str, Enum):
    HEALED = "healed"
    NOT_HEALED = "not_healed"
    DIVERGED = "diverged"


class Decision(str, Enum):
    LEAVE = "leave"
    ROLLBACK = "rollback"


@dataclass(frozen=True)
class SpikeSettings:
    """Thresholds of the detector and of the rollback policy. Defaults are argued in the docstring
    of domain.spikes.detector and in ``docs`` of issue 6; all are per run configurable."""

    window: int = 50  # healthy records in the rolling baseline
    min_baseline: int = 1  # records needed before anything is judged
    spike_z: float = 6.0  # robust z of the loss that opens a spike
    min_rel_jump: float = 0.10  # ... and at least this much above the baseline median
    rel_sigma_floor: float = 0.02  # sigma never below this fraction of |median|
    heal_band_z: float = 3.0  # healed: within this many sigmas of the baseline ...
    heal_band_rel: float = 0.05  # ... or this fraction of it, whichever is wider
    heal_confirm_records: int = 2  # consecutive in-band records that count as healed
    heal_window_steps: int = 200  # steps after onset by which the loss must be back in band
    diverge_rises: int = 3  # consecutive rising loss records (spike open) that mean divergence
    diverge_min_steps: int = 20  # ... spanning at least this many steps
    grad_spike_z: float = 8.0  # robust z of log10(grad norm) that opens a grad-norm spike
    grad_min_ratio: float = 10.0  # ... and at least this multiple of the baseline
    grad_sigma_floor: float = 0.1  # log10 units (a factor of ~1.26)
    max_nonfinite_records: int = 0  # consecutive non-finite records tolerated
    loss_scale_floor: float = 1.0  # fp16 loss scale at or below this is a collapse (OPT: >= 1)
    loss_scale_max_halvings: int = 10  # consecutive records with a falling loss scale
    # trajectory of an open loss spike (domain.spikes.trajectory): judged once it has settled
    early_decisions: bool = True  # False: the issue-6 rules only (a fixed heal window, no plateau rule)
    heal_cap_steps: int = 1000  # a spike still returning toward its band is waited on this long at most
    settle_steps: int = 20  # steps after the peak before the trajectory is judged ...
    settle_records: int = 6  # ... and records after the peak
    return_z: float = 1.0  # Mann-Kendall z at or below -this over the recent records: coming down
    grad_elevated_ratio: float = 3.0  # grad norm this many times its pre-spike median: still unstable
    # trend (domain.spikes.divergence): a climb relative to the run's own recent history, no jump needed
    trend_detection: bool = True
    trend_history: int = 96  # healthy records kept: the older part is the reference ...
    trend_window: int = 48  # ... the newest (at most) this many the window tested for a trend
    trend_min_records: int = 8  # records needed in the window and in the reference
    trend_z: float = 3.0  # Mann-Kendall z of the window at or above this: a significant climb ...
    trend_min_rise: float = 0.08  # ... that put the newest level this fraction above the reference ...
    trend_rise_z: float = 4.0  # ... and this many reference sigmas above it;
    trend_min_rise_grad: float = 0.03  # or a smaller rise while the grad norm climbs ...
    grad_trend_ratio: float = 4.0  # ... to this multiple of its reference, significantly too
    # rollback policy (PaLM: restart ~100 steps before the spike, skip ~200-500 batches)
    min_steps_before: int = 100  # checkpoint at least this many steps before the onset
    skip_batches: int = 300  # iterations skipped from the restart step on (at least) ...
    skip_past_onset: int = 50  # ... and at least this far past the onset

    def __post_init__(self) -> None:
        if self.window < 1 or self.min_baseline < 1 or self.heal_confirm_records < 1:
            raise ValueError("window, min_baseline and heal_confirm_records must be >= 1")
        if self.heal_window_steps < 0 or self.min_steps_before < 0 or self.skip_batches < 0:
            raise ValueError("step counts must be >= 0")
        if self.settle_records < 2 or self.trend_min_records < 3 or self.trend_window < self.trend_min_records:
            raise ValueError("settle_records >= 2, trend_min_records >= 3 and trend_window >= trend_min_records")
        if self.trend_history < self.trend_window + self.trend_min_records:
            raise ValueError("trend_history must hold trend_window plus trend_min_records reference records")

    @property
    def heal_cap(self) -> int:
        """The longest a returning spike is waited on: never shorter than the fixed heal window."""
        return max(self.heal_cap_steps, self.heal_window_steps)


@dataclass(frozen=True)
class SpikeEvent:
    """Something started at ``onset_step``: ``value`` against the baseline ``baseline`` ±
    ``sigma`` (log10 units for grad norms), ``severity_z`` robust z (``None`` where it has none)."""

    kind: SpikeKind
    onset_step: int
    value: float
    baseline: float | None
    sigma: float | None
    severity_z: float | None
    reason: str


@dataclass(frozen=True)
class SpikeOutcome:
    """How an event ended and what to do about it."""

    event: SpikeEvent
    status: SpikeStatus
    decision: Decision
    rule: str
    decided_step: int
    peak_step: int
    peak_value: float
    peak_z: float | None
    steps_after_onset: int  # the decision latency: steps from the onset to the decision
    reason: str
    figures: Mapping[str, float | int | str] = field(default_factory=dict)  # the rule's numbers, for the logbook


Notice = SpikeEvent | SpikeOutcome


@dataclass(frozen=True)
class Peak:
    """The highest value an event reached, where, and its robust z (``None`` where it has none)."""

    step: int
    value: float
    z: float | None


def outcome(
    event: SpikeEvent,
    status: SpikeStatus,
    rule: str,
    step: int,
    peak: Peak,
    reason: str,
    figures: Mapping[str, float | int | str] | None = None,
) -> SpikeOutcome:
    """The outcome of ``event`` decided at ``step``: LEAVE when it healed, ROLLBACK otherwise."""
    decision = Decision.LEAVE if status is SpikeStatus.HEALED else Decision.ROLLBACK
    return SpikeOutcome(
        event=event,
        status=status,
        decision=decision,
        rule=rule,
        decided_step=step,
        peak_step=peak.step,
        peak_value=peak.value,
        peak_z=peak.z,
        steps_after_onset=step - event.onset_step,
        reason=reason,
        figures=dict(figures or {}),
    )


def decide(notices: list[Notice]) -> Decision:
    """ROLLBACK if any outcome in ``notices`` asks for one, else LEAVE (undecided spikes are waited
    on: the heal window has not run out)."""
    for n in notices:
        if isinstance(n, SpikeOutcome) and n.decision is Decision.ROLLBACK:
            return Decision.ROLLBACK
    return Decision.LEAVE


def robust_stats(values: Iterable[float], rel_floor: float, abs_floor: float = 0.0) -> tuple[float, float]:
    """Median and robust sigma (1.4826 x MAD, floored) of a non-empty collection. Plain sorting:
    for the few dozen values of a baseline it is several times faster than numpy's median."""
    ordered = sorted(values)
    median = median_of_sorted(ordered)
    mad = median_of_sorted(sorted(abs(v - median) for v in ordered))
    sigma = max(_MAD_TO_SIGMA * mad, rel_floor * abs(median), abs_floor, 1e-12)
    return median, sigma


def median_of_sorted(ordered: Sequence[float]) -> float:
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])
