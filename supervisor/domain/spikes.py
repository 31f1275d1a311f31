"""What loss-spike detection says: the detector's settings, the events and outcomes it reports,
and the leave-it / roll-back decision over them.

Pure domain: no I/O, no clock. The detector that produces these values, and the reasoning behind
its rules and defaults, is :mod:`supervisor.domain.spike_detector`; the rollback policy that acts
on a ROLLBACK outcome is :mod:`supervisor.domain.rollback`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

_MAD_TO_SIGMA = 1.4826


class SpikeKind(str, Enum):
    LOSS = "loss"
    GRAD_NORM = "grad_norm"
    NONFINITE = "nonfinite"
    LOSS_SCALE = "loss_scale"


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
    of domain.spike_detector and in ``docs`` of issue 6; all are per run configurable."""

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
    # rollback policy (PaLM: restart ~100 steps before the spike, skip ~200-500 batches)
    min_steps_before: int = 100  # checkpoint at least this many steps before the onset
    skip_batches: int = 300  # iterations skipped from the restart step on (at least) ...
    skip_past_onset: int = 50  # ... and at least this far past the onset

    def __post_init__(self) -> None:
        if self.window < 1 or self.min_baseline < 1 or self.heal_confirm_records < 1:
            raise ValueError("window, min_baseline and heal_confirm_records must be >= 1")
        if self.heal_window_steps < 0 or self.min_steps_before < 0 or self.skip_batches < 0:
            raise ValueError("step counts must be >= 0")


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
    steps_after_onset: int
    reason: str


Notice = SpikeEvent | SpikeOutcome


@dataclass(frozen=True)
class Peak:
    """The highest value an event reached, where, and its robust z (``None`` where it has none)."""

    step: int
    value: float
    z: float | None


def outcome(event: SpikeEvent, status: SpikeStatus, rule: str, step: int, peak: Peak, reason: str) -> SpikeOutcome:
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
    )


def decide(notices: list[Notice]) -> Decision:
    """ROLLBACK if any outcome in ``notices`` asks for one, else LEAVE (undecided spikes are waited
    on: the heal window has not run out)."""
    for n in notices:
        if isinstance(n, SpikeOutcome) and n.decision is Decision.ROLLBACK:
            return Decision.ROLLBACK
    return Decision.LEAVE


def robust_stats(values: list[float], rel_floor: float, abs_floor: float = 0.0) -> tuple[float, float]:
    """Median and robust sigma (1.4826 x MAD, floored) of a non-empty list."""
    ordered = sorted(values)
    median = _median(ordered)
    mad = _median(sorted(abs(v - median) for v in ordered))
    sigma = max(_MAD_TO_SIGMA * mad, rel_floor * abs(median), abs_floor, 1e-12)
    return median, sigma


def _median(ordered: list[float]) -> float:
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])
