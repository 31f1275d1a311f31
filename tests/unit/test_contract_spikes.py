"""The spike vocabulary's public contract (``domain.spikes.events``): settings checks, an outcome's decision
and latency, the leave-it / roll-back decision over notices, and the robust statistics."""

import dataclasses

import pytest

from supervisor.domain.spikes.events import (
    Decision,
    Peak,
    SpikeEvent,
    SpikeKind,
    SpikeSettings,
    SpikeStatus,
    decide,
    median_of_sorted,
    outcome,
    robust_stats,
)

EVENT = SpikeEvent(SpikeKind.LOSS, 1000, 5.0, 2.0, 0.1, 30.0, "loss jumped")


@pytest.mark.parametrize(
    "bad",
    [
        dict(window=0),
        dict(min_baseline=0),
        dict(heal_confirm_records=0),
        dict(heal_window_steps=-1),
        dict(min_steps_before=-1),
        dict(skip_batches=-1),
        dict(settle_records=1),
        dict(trend_min_records=2, trend_window=2),
        dict(trend_window=7, trend_min_records=8),
        dict(trend_history=55, trend_window=48, trend_min_records=8),
    ],
)
def test_settings_are_checked(bad):
    with pytest.raises(ValueError):
        SpikeSettings(**bad)


def test_settings_at_their_limits_are_accepted():
    s = SpikeSettings(window=1, min_baseline=1, heal_confirm_records=1, heal_window_steps=0, min_steps_before=0)
    SpikeSettings(skip_batches=0, settle_records=2, trend_min_records=3, trend_window=3, trend_history=6)
    SpikeSettings(trend_history=56, trend_window=48, trend_min_records=8)
    assert s.skip_batches == 300 and s.min_steps_before == 0


@pytest.mark.parametrize(
    ("status", "decision"),
    [
        (SpikeStatus.HEALED, Decision.LEAVE),
        (SpikeStatus.NOT_HEALED, Decision.ROLLBACK),
        (SpikeStatus.DIVERGED, Decision.ROLLBACK),
    ],
)
def test_an_outcome_rolls_back_unless_healed(status, decision):
    o = outcome(EVENT, status, "rule", 1200, Peak(1010, 6.0, 40.0), "why", {"k": 1})
    assert o.decision is decision
    assert (o.event, o.status, o.rule, o.decided_step, o.reason) == (EVENT, status, "rule", 1200, "why")
    assert (o.peak_step, o.peak_value, o.peak_z, o.steps_after_onset) == (1010, 6.0, 40.0, 200)
    assert dict(o.figures) == {"k": 1}
    assert dict(outcome(EVENT, status, "rule", 1000, Peak(1000, 5.0, None), "why").figures) == {}


def test_decide_rolls_back_when_any_outcome_asks():
    healed = outcome(EVENT, SpikeStatus.HEALED, "r", 1100, Peak(1000, 5.0, 30.0), "ok")
    bad = outcome(EVENT, SpikeStatus.DIVERGED, "r", 1100, Peak(1000, 5.0, 30.0), "up")
    assert decide([]) is Decision.LEAVE
    assert decide([EVENT, healed]) is Decision.LEAVE
    assert decide([EVENT, healed, bad]) is Decision.ROLLBACK
    assert decide([bad, healed]) is Decision.ROLLBACK


def test_robust_stats_median_and_floored_mad_sigma():
    median, sigma = robust_stats([1.0, 2.0, 3.0, 4.0, 100.0], rel_floor=0.0)
    assert median == 3.0 and sigma == pytest.approx(1.4826 * 1.0)
    assert robust_stats([4.0, 2.0], rel_floor=0.0) == (3.0, pytest.approx(1.4826))
    assert robust_stats([10.0, 10.0, 10.0], rel_floor=0.02) == (10.0, pytest.approx(0.2))
    assert robust_stats([-10.0, -10.0], rel_floor=0.02) == (-10.0, pytest.approx(0.2))
    assert robust_stats([10.0, 10.0], rel_floor=0.02, abs_floor=0.5) == (10.0, 0.5)
    assert robust_stats([0.0, 0.0], rel_floor=0.02) == (0.0, 1e-12)
    assert median_of_sorted([1.0, 2.0, 5.0]) == 2.0 and median_of_sorted([1.0, 2.0, 5.0, 9.0]) == 3.5
    assert median_of_sorted([1.0, 2.0, 10.0, 20.0, 30.0, 40.0]) == 15.0  # the middle two, whatever n


def test_settings_events_and_outcomes_are_immutable_values():
    o = outcome(EVENT, SpikeStatus.HEALED, "r", 1100, Peak(1000, 5.0, 30.0), "ok")
    for value in (SpikeSettings(), EVENT, o, Peak(1, 2.0, None)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            value.reason = "changed"  # type: ignore[misc]


def test_defaults_are_the_documented_ones():
    s = SpikeSettings()
    assert (s.window, s.min_baseline, s.spike_z, s.min_rel_jump, s.rel_sigma_floor) == (50, 1, 6.0, 0.10, 0.02)
    assert (s.heal_band_z, s.heal_band_rel, s.heal_confirm_records, s.heal_window_steps) == (3.0, 0.05, 2, 200)
    assert (s.diverge_rises, s.diverge_min_steps) == (3, 20)
    assert (s.grad_spike_z, s.grad_min_ratio, s.grad_sigma_floor) == (8.0, 10.0, 0.1)
    assert (s.max_nonfinite_records, s.loss_scale_floor, s.loss_scale_max_halvings) == (0, 1.0, 10)
    assert (s.min_steps_before, s.skip_batches, s.skip_past_onset) == (100, 300, 50)
    # the trajectory and trend rules as docs/configuration.md states them
    assert (s.heal_cap_steps, s.grad_elevated_ratio) == (1000, 3.0)
    assert (s.trend_window, s.trend_z, s.trend_min_rise, s.trend_rise_z) == (48, 3.0, 0.08, 4.0)
    assert (s.trend_min_rise_grad, s.grad_trend_ratio) == (0.03, 4.0)
    assert (s.trend_history, s.trend_min_records, s.settle_steps, s.settle_records) == (96, 8, 20, 6)
