"""Loss-spike detection on a job's progress stream.

The values it reports (events, outcomes, settings) and the leave-it / roll-back decision over them
are in :mod:`supervisor.domain.spikes.events`; the loss and grad-norm rules in
:mod:`supervisor.domain.spikes.watches`; the rollback policy in :mod:`supervisor.domain.spikes.rollback`.

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
  A streak that began before the onset counts only if it crept up on two records or more, by more
  than noise (a spike logged across two records is no creep).
* ``trend`` (domain.spikes.divergence): a steady climb of the loss against the run's own recent history
  (Mann-Kendall rank test, level vs reference), no jump needed → ROLLBACK, onset where the climb
  began; inside an open spike, a loss that keeps making new highs significantly does the same.
* ``plateau`` / ``aftershock`` (domain.spikes.trajectory): the spike settled above the band and is
  not coming down, with the grad norm several times its pre-spike median, or after a further
  spike → ROLLBACK now, without waiting for the heal window.
* ``not_healed``: a record more than ``heal_window_steps`` after the onset still outside the band
  and not coming down, or more than ``heal_cap`` after it even though coming down → ROLLBACK.
  Every outcome carries ``figures`` (the rule's numbers) and ``steps_after_onset`` (the decision
  latency).
* A grad-norm spike without a loss excursion is logged and left alone (rule ``grad_norm_only``).

After a ROLLBACK outcome the loss baseline is relearned from the following records (the engine
is expected to restart the job with a fresh detector anyway); the detector does not re-fire on
the new level every heal window.
"""

from __future__ import annotations

import math

from supervisor.domain.progress.record import ProgressRecord
from supervisor.domain.spikes.divergence import TrendWatch
from supervisor.domain.spikes.events import (
    Decision,
    Notice,
    Peak,
    SpikeEvent,
    SpikeKind,
    SpikeOutcome,
    SpikeSettings,
    SpikeStatus,
    outcome,
)
from supervisor.domain.spikes.watches import GradWatch, LossWatch


class SpikeDetector:
    """Feed records in step order with :meth:`feed`; each call returns the notices it produced.
    Records without a step are ignored; a record with a step not above the last one is ignored
    too (a replayed or duplicated line)."""

    def __init__(self, settings: SpikeSettings | None = None) -> None:
        self.settings = settings or SpikeSettings()
        self._loss = LossWatch(self.settings)
        self._grad = GradWatch(self.settings)
        self._scale = ScaleWatch(self.settings)
        self._trend = TrendWatch(self.settings)
        self._last_step: int | None = None
        self._nonfinite_run = 0

    @property
    def open_spike(self) -> SpikeEvent | None:
        """The loss spike still waiting for its outcome, if any."""
        return self._loss.spike.event if self._loss.spike else None

    def pending(self) -> list[SpikeEvent]:
        """Every event still undecided (loss and grad-norm spikes)."""
        return [o.event for o in (self._loss.spike, self._grad.spike) if o is not None]

    def feed(self, record: ProgressRecord) -> list[Notice]:
        step = record.step
        if step is None or (self._last_step is not None and step <= self._last_step):
            return []
        self._last_step = step
        out = self._check_nonfinite(record, step)
        out += self._scale.check(record.loss_scale, step)
        g = record.grad_norm
        lgrad = math.log10(g) if g is not None and math.isfinite(g) and g > 0 else None
        if record.loss is not None and math.isfinite(record.loss):
            out += self._check_loss(record.loss, lgrad, step)
        if lgrad is not None and g is not None:
            out += self._grad.check(g, step)
        return out

    def _check_loss(self, loss: float, lgrad: float | None, step: int) -> list[Notice]:
        """The jump and trajectory rules, then — for a healthy record — the trend rule. Any
        rollback outcome resets the trend's history too (the engine restarts the job anyway)."""
        was_open = self._loss.spike is not None
        out = self._loss.check(loss, step, lgrad)
        if self._loss.spike is not None and not was_open:
            self._trend.forget()  # the level after a spike is compared with what follows it, not with before
        elif not was_open and self.settings.trend_detection:
            out += self._trend.check(loss, lgrad, step)
        if any(isinstance(n, SpikeOutcome) and n.decision is Decision.ROLLBACK for n in out):
            self._loss.forget()
            self._trend.forget()
        return out

    def feed_all(self, records: list[ProgressRecord]) -> list[Notice]:
        out: list[Notice] = []
        for r in records:
            out.extend(self.feed(r))
        return out

    def _check_nonfinite(self, record: ProgressRecord, step: int) -> list[Notice]:
        if not record.nonfinite:
            self._nonfinite_run = 0
            return []
        self._nonfinite_run += 1
        tolerated = self.settings.max_nonfinite_records
        if self._nonfinite_run != tolerated + 1:
            return []
        self._loss.forget()  # superseded
        self._trend.forget()
        return _nonfinite(record, step, self._nonfinite_run, tolerated)


def _nonfinite(record: ProgressRecord, step: int, run: int, tolerated: int) -> list[Notice]:
    """The event and ROLLBACK outcome of ``run`` consecutive non-finite records."""
    value = record.loss if record.loss is not None else math.nan
    what = "no loss printed (Megatron leaves out a NaN loss)" if record.loss is None else f"loss {value}"
    reason = f"non-finite values at step {step}: {what}, grad norm {record.grad_norm}"
    event = SpikeEvent(SpikeKind.NONFINITE, step, value, None, None, None, reason)
    why = f"{run} consecutive non-finite record(s) (tolerated: {tolerated}) → roll back"
    return [event, outcome(event, SpikeStatus.DIVERGED, "nonfinite", step, Peak(step, value, None), why)]


class ScaleWatch:
    """The fp16 loss-scale rules: a scale at or below the floor, or falling on too many consecutive
    records, is a collapse; it is reported once, until the scale recovers."""

    def __init__(self, settings: SpikeSettings) -> None:
        self.settings = settings
        self._last: float | None = None
        self._peak = 0.0  # highest loss scale seen: bf16 and static scaling print a constant 1.0
        self._halvings = 0
        self._collapsed = False

    def check(self, scale: float | None, step: int) -> list[Notice]:
        if scale is None or not math.isfinite(scale):
            return []
        self._track(scale)
        floor = self.settings.loss_scale_floor
        if self._peak <= floor:
            return []  # no dynamic loss scaling (bf16 prints "loss scale: 1.0" throughout): nothing can collapse
        if self._collapsed:
            if scale > floor and self._halvings == 0:
                self._collapsed = False
            return []
        collapse = self._collapse(scale)
        if collapse is None:
            return []
        self._collapsed = True
        rule, why = collapse
        event = SpikeEvent(SpikeKind.LOSS_SCALE, step, scale, None, None, None, f"fp16 {why} at step {step}")
        reason = f"{why}: gradients overflow persistently → roll back"
        return [event, outcome(event, SpikeStatus.DIVERGED, rule, step, Peak(step, scale, None), reason)]

    def _track(self, scale: float) -> None:
        if self._last is not None and scale < self._last:
            self._halvings += 1
        elif self._last is not None and scale > self._last:
            self._halvings = 0
        self._last = scale
        self._peak = max(self._peak, scale)

    def _collapse(self, scale: float) -> tuple[str, str] | None:
        """The rule a collapse breaks and why, in words; None while the scale holds."""
        s = self.settings
        if scale <= s.loss_scale_floor:
            return "loss_scale_floor", f"loss scale {scale:g} at or below the floor {s.loss_scale_floor:g}"
        if self._halvings >= s.loss_scale_max_halvings:
            return "loss_scale_halvings", f"loss scale fell on {self._halvings} consecutive records, now {scale:g}"
        return None
