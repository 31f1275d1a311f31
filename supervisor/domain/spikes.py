"""Loss-spike detection on a job's progress stream, the leave-it / roll-back decision, and the
pure parts of the rollback policy (which checkpoint, which batches to skip).

Pure domain: no I/O, no clock. A :class:`SpikeDetector` is fed :class:`ProgressRecord` values in
step order and answers, per record, with the notices it produced: a :class:`SpikeEvent` when
something starts (a loss spike, a grad-norm spike, a non-finite loss, a loss-scale collapse) and
a :class:`SpikeOutcome` once the event is decided (healed and left alone, or not healed /
diverged and to be rolled back).

Why a rolling median + MAD and not an EMA with a robust variance
---------------------------------------------------------------
Real progress logs are sparse (Megatron prints every 10 or 100 iterations) and the excerpts one
has to decide on are short, so the baseline often rests on one to a few dozen records. A median
over the last ``window`` healthy records is exact from the first record on, needs no warm-up or
decay constant, is not dragged up by the spike itself (records inside an open spike are kept out
of the window) nor by an earlier outlier, and the MAD gives a noise scale with the same
properties. An EMA would need a decay chosen against the logging interval and lets one outlier
leak into the baseline for many records. The cost (sorting ``window`` floats per record) is
negligible at progress-line rates. The MAD is floored at a fraction of the median
(``rel_sigma_floor``) so that a flat stretch does not turn rounding noise into alarms.

Grad norms are multiplicative and heavy-tailed, so their statistics are taken on ``log10``.

Rules (each outcome carries its rule name and the numbers, worded for the logbook)
------------------------------------------------------------------------------------
* ``nonfinite``: a record with a NaN/Inf loss or grad norm (or one Megatron left out) → ROLLBACK,
  after ``max_nonfinite_records`` consecutive ones are tolerated (default 0).
* ``loss_scale_floor`` / ``loss_scale_halvings``: fp16 loss scale at or below
  ``loss_scale_floor`` or dropping on ``loss_scale_max_halvings`` consecutive records → ROLLBACK.
* ``healed``: after a loss spike, ``heal_confirm_records`` consecutive records back inside the
  band around the pre-spike baseline → LEAVE.
* ``diverged``: with a spike open, the loss has risen on ``diverge_rises`` consecutive records
  (the streak may start before the onset: a creeping rise), spanning at least
  ``diverge_min_steps`` steps, and the last record is the spike's new high → ROLLBACK without
  waiting for the heal window.
* ``not_healed``: a record more than ``heal_window_steps`` after the onset still outside the band
  → ROLLBACK.
* A grad-norm spike without a loss excursion is logged and left alone (rule ``grad_norm_only``).

After a ROLLBACK outcome the loss baseline is relearned from the following records (the engine
is expected to restart the job with a fresh detector anyway); the detector does not re-fire on
the new level every heal window.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from enum import Enum

from supervisor.domain.progress.record import ProgressRecord

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
    """Thresholds of the detector and of the rollback policy. Defaults are argued in the module
    docstring and in ``docs`` of issue 6; all are per run configurable."""

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


@dataclass
class _Open:
    event: SpikeEvent
    band_hi: float
    peak_step: int
    peak_value: float
    in_band: int = 0


class SpikeDetector:
    """Feed records in step order with :meth:`feed`; each call returns the notices it produced.
    Records without a step are ignored; a record with a step not above the last one is ignored
    too (a replayed or duplicated line)."""

    def __init__(self, settings: SpikeSettings | None = None) -> None:
        self.settings = settings or SpikeSettings()
        self._loss: deque[float] = deque(maxlen=self.settings.window)
        self._grad: deque[float] = deque(maxlen=self.settings.window)
        self._last_step: int | None = None
        self._loss_spike: _Open | None = None
        self._grad_spike: _Open | None = None
        self._nonfinite_run = 0
        self._last_scale: float | None = None
        self._peak_scale = 0.0  # highest loss scale seen: bf16 and static scaling print a constant 1.0
        self._halvings = 0
        self._scale_collapsed = False
        self._prev_loss: float | None = None
        self._rises = 0
        self._rise_start = 0

    @property
    def open_spike(self) -> SpikeEvent | None:
        """The loss spike still waiting for its outcome, if any."""
        return self._loss_spike.event if self._loss_spike else None

    def pending(self) -> list[SpikeEvent]:
        """Every event still undecided (loss and grad-norm spikes)."""
        return [o.event for o in (self._loss_spike, self._grad_spike) if o is not None]

    def feed(self, record: ProgressRecord) -> list[Notice]:
        step = record.step
        if step is None or (self._last_step is not None and step <= self._last_step):
            return []
        self._last_step = step
        out: list[Notice] = []
        self._check_nonfinite(record, step, out)
        self._check_loss_scale(record, step, out)
        if record.loss is not None and math.isfinite(record.loss):
            self._check_loss(record.loss, step, out)
        g = record.grad_norm
        if g is not None and math.isfinite(g) and g > 0:
            self._check_grad(math.log10(g), g, step, out)
        return out

    def feed_all(self, records: list[ProgressRecord]) -> list[Notice]:
        out: list[Notice] = []
        for r in records:
            out.extend(self.feed(r))
        return out

    # ------------------------------------------------------------------ non-finite, loss scale

    def _check_nonfinite(self, record: ProgressRecord, step: int, out: list[Notice]) -> None:
        if not record.nonfinite:
            self._nonfinite_run = 0
            return
        self._nonfinite_run += 1
        if self._nonfinite_run != self.settings.max_nonfinite_records + 1:
            return
        value = record.loss if record.loss is not None else math.nan
        what = "no loss printed (Megatron leaves out a NaN loss)" if record.loss is None else f"loss {value}"
        event = SpikeEvent(
            SpikeKind.NONFINITE,
            step,
            value,
            None,
            None,
            None,
            f"non-finite values at step {step}: {what}, grad norm {record.grad_norm}",
        )
        out.append(event)
        out.append(
            self._decide(
                event,
                SpikeStatus.DIVERGED,
                "nonfinite",
                step,
                step,
                value,
                None,
                f"{self._nonfinite_run} consecutive non-finite record(s) (tolerated: "
                f"{self.settings.max_nonfinite_records}) → roll back",
            )
        )
        self._loss_spike = None  # superseded
        self._loss.clear()

    def _check_loss_scale(self, record: ProgressRecord, step: int, out: list[Notice]) -> None:
        scale = record.loss_scale
        if scale is None or not math.isfinite(scale):
            return
        s = self.settings
        if self._last_scale is not None and scale < self._last_scale:
            self._halvings += 1
        elif self._last_scale is not None and scale > self._last_scale:
            self._halvings = 0
        self._last_scale = scale
        self._peak_scale = max(self._peak_scale, scale)
        if self._peak_scale <= s.loss_scale_floor:
            return  # no dynamic loss scaling (bf16 prints "loss scale: 1.0" throughout): nothing can collapse
        if self._scale_collapsed:
            if scale > s.loss_scale_floor and self._halvings == 0:
                self._scale_collapsed = False
            return
        rule = None
        if scale <= s.loss_scale_floor:
            rule = "loss_scale_floor"
            why = f"loss scale {scale:g} at or below the floor {s.loss_scale_floor:g}"
        elif self._halvings >= s.loss_scale_max_halvings:
            rule = "loss_scale_halvings"
            why = f"loss scale fell on {self._halvings} consecutive records, now {scale:g}"
        if rule is None:
            return
        self._scale_collapsed = True
        event = SpikeEvent(SpikeKind.LOSS_SCALE, step, scale, None, None, None, f"fp16 {why} at step {step}")
        out.append(event)
        out.append(
            self._decide(
                event,
                SpikeStatus.DIVERGED,
                rule,
                step,
                step,
                scale,
                None,
                f"{why}: gradients overflow persistently → roll back",
            )
        )

    # ------------------------------------------------------------------ loss

    def _check_loss(self, loss: float, step: int, out: list[Notice]) -> None:
        s = self.settings
        if self._prev_loss is not None and loss > self._prev_loss:
            self._rises += 1
        else:
            self._rises = 0
            self._rise_start = step
        self._prev_loss = loss
        spike = self._loss_spike
        if spike is None:
            if len(self._loss) >= s.min_baseline:
                median, sigma = robust_stats(list(self._loss), s.rel_sigma_floor)
                z = (loss - median) / sigma
                if z >= s.spike_z and loss - median >= s.min_rel_jump * abs(median):
                    band = median + max(s.heal_band_z * sigma, s.heal_band_rel * abs(median))
                    event = SpikeEvent(
                        SpikeKind.LOSS,
                        step,
                        loss,
                        median,
                        sigma,
                        z,
                        f"loss spike at step {step}: {loss:.4g} vs baseline median {median:.4g} "
                        f"(robust sigma {sigma:.3g}, z {z:.1f}, +{(loss / median - 1) * 100:.0f}%)"
                        if median
                        else f"loss spike at step {step}: {loss:.4g} (z {z:.1f})",
                    )
                    self._loss_spike = _Open(event, band, step, loss)
                    out.append(event)
                    return
            self._loss.append(loss)
            return

        ev = spike.event
        assert ev.baseline is not None and ev.sigma is not None
        after = step - ev.onset_step
        new_high = loss > spike.peak_value
        if new_high:
            spike.peak_value, spike.peak_step = loss, step
        peak_z = (spike.peak_value - ev.baseline) / ev.sigma
        span = step - self._rise_start
        if new_high and self._rises >= s.diverge_rises and span >= s.diverge_min_steps:
            out.append(
                self._decide(
                    ev,
                    SpikeStatus.DIVERGED,
                    "diverged",
                    step,
                    spike.peak_step,
                    spike.peak_value,
                    peak_z,
                    f"loss rose on {self._rises} consecutive records over {span} steps (since step "
                    f"{self._rise_start}), now {loss:.4g} vs baseline {ev.baseline:.4g} (z {peak_z:.1f}) "
                    f"→ roll back",
                )
            )
            self._loss_spike = None
            self._loss.clear()
            return
        if loss <= spike.band_hi:
            spike.in_band += 1
            if spike.in_band >= s.heal_confirm_records:
                out.append(
                    self._decide(
                        ev,
                        SpikeStatus.HEALED,
                        "healed",
                        step,
                        spike.peak_step,
                        spike.peak_value,
                        peak_z,
                        f"loss back to {loss:.4g} (band ≤ {spike.band_hi:.4g} around baseline "
                        f"{ev.baseline:.4g}) {after} steps after onset, peak {spike.peak_value:.4g} at "
                        f"step {spike.peak_step} (z {peak_z:.1f}); healed by itself → leave it",
                    )
                )
                self._loss_spike = None
            return
        spike.in_band = 0
        if after > s.heal_window_steps:
            out.append(
                self._decide(
                    ev,
                    SpikeStatus.NOT_HEALED,
                    "not_healed",
                    step,
                    spike.peak_step,
                    spike.peak_value,
                    peak_z,
                    f"loss still {loss:.4g} at step {step}, {after} steps after onset (heal window "
                    f"{s.heal_window_steps}), above the band ≤ {spike.band_hi:.4g} around baseline "
                    f"{ev.baseline:.4g}; peak {spike.peak_value:.4g} (z {peak_z:.1f}) → roll back",
                )
            )
            self._loss_spike = None
            self._loss.clear()  # a new level: relearn the baseline rather than re-fire on it

    # ------------------------------------------------------------------ grad norm

    def _check_grad(self, lg: float, g: float, step: int, out: list[Notice]) -> None:
        s = self.settings
        spike = self._grad_spike
        if spike is None:
            if len(self._grad) >= s.min_baseline:
                median, sigma = robust_stats(list(self._grad), 0.0, s.grad_sigma_floor)
                z = (lg - median) / sigma
                if z >= s.grad_spike_z and lg - median >= math.log10(s.grad_min_ratio):
                    band = median + max(s.heal_band_z * sigma, math.log10(2.0))
                    event = SpikeEvent(
                        SpikeKind.GRAD_NORM,
                        step,
                        g,
                        10**median,
                        sigma,
                        z,
                        f"grad-norm spike at step {step}: {g:.4g} vs baseline median "
                        f"{10**median:.4g} (x{g / 10**median:.0f}, z {z:.1f} on log10)",
                    )
                    self._grad_spike = _Open(event, band, step, g)
                    out.append(event)
                    return
            self._grad.append(lg)
            return
        ev = spike.event
        if g > spike.peak_value:
            spike.peak_value, spike.peak_step = g, step
        if lg <= spike.band_hi:
            spike.in_band += 1
            if spike.in_band >= s.heal_confirm_records:
                assert ev.sigma is not None and ev.baseline is not None
                peak_z = (math.log10(spike.peak_value) - math.log10(ev.baseline)) / ev.sigma
                out.append(
                    self._decide(
                        ev,
                        SpikeStatus.HEALED,
                        "grad_norm_only",
                        step,
                        spike.peak_step,
                        spike.peak_value,
                        peak_z,
                        f"grad norm back to {g:.4g} {step - ev.onset_step} steps after onset, peak "
                        f"{spike.peak_value:.4g} at step {spike.peak_step}; the loss decides → leave it",
                    )
                )
                self._grad_spike = None
        else:
            spike.in_band = 0

    @staticmethod
    def _decide(
        event: SpikeEvent,
        status: SpikeStatus,
        rule: str,
        step: int,
        peak_step: int,
        peak_value: float,
        peak_z: float | None,
        reason: str,
    ) -> SpikeOutcome:
        decision = Decision.LEAVE if status is SpikeStatus.HEALED else Decision.ROLLBACK
        return SpikeOutcome(
            event,
            status,
            decision,
            rule,
            step,
            peak_step,
            peak_value,
            peak_z,
            step - event.onset_step,
            reason,
        )


def decide(notices: list[Notice]) -> Decision:
    """ROLLBACK if any outcome in ``notices`` asks for one, else LEAVE (undecided spikes are waited
    on: the heal window has not run out)."""
    for n in notices:
        if isinstance(n, SpikeOutcome) and n.decision is Decision.ROLLBACK:
            return Decision.ROLLBACK
    return Decision.LEAVE
