"""Stragglers' public contract on plain data: parameter checks, per-node times from per-rank ones,
the scorer's verdict on a clearly slow node, and the throughput detector's exact boundaries."""

import dataclasses

import numpy as np
import pytest

from supervisor.domain.pace.slowdown import SlowdownDetector, SlowdownState
from supervisor.domain.pace.stragglers import (
    StragglerParams,
    StragglerScorer,
    node_peer_groups,
    node_step_times,
)


@pytest.mark.parametrize(
    "bad",
    [
        dict(alpha=0.0),
        dict(alpha=1.01),
        dict(k=0.0),
        dict(h=0.0),
        dict(z_clip=1.5),
        dict(mad_floor=0.0),
        dict(min_slowdown=-0.01),
        dict(learn_steps=0),
        dict(min_block=1),
    ],
)
def test_params_are_checked(bad):
    with pytest.raises(ValueError):
        StragglerParams(**bad)


def test_params_at_their_limits_are_accepted():
    StragglerParams(alpha=1.0, min_slowdown=0.0, z_clip=1.6, k=1.5, learn_steps=1, min_block=2)


def test_node_time_is_its_slowest_finite_rank():
    times = node_step_times([1.0, 3.0, np.nan, 2.0, np.nan, np.nan], 2)
    assert times[:2].tolist() == [3.0, 2.0] and np.isnan(times[2])
    with pytest.raises(ValueError):
        node_step_times([1.0, 2.0, 3.0], 2)
    with pytest.raises(ValueError):
        node_step_times([1.0, 2.0], 0)
    with pytest.raises(ValueError):
        node_step_times([1.0, 2.0], -1)
    assert node_step_times([1.0, 2.0], 1).tolist() == [1.0, 2.0]


def test_nodes_with_the_same_rank_groups_are_peers():
    assert node_peer_groups([0, 1, 0, 1, 2, 2], 2).tolist() == [0, 0, 1]
    assert node_peer_groups([5, 5, 5, 5], 4).tolist() == [0]
    for groups, per_node in (([0, 1, 2], 2), ([0, 1], 0), ([0, 1], -2)):
        with pytest.raises(ValueError):
            node_peer_groups(groups, per_node)


def test_scorer_checks_its_shape():
    with pytest.raises(ValueError):
        StragglerScorer(0)
    with pytest.raises(ValueError):
        StragglerScorer(3, names=["a", "b"])
    with pytest.raises(ValueError):
        StragglerScorer(3).update([1.0, 1.0])
    with pytest.raises(ValueError):
        StragglerScorer(3).update([1.0, 1.0, 1.0], sm_clock_ratio=[1.0])


def run_scorer(slow=1.10, steps=60, nodes=8, **health):
    rng = np.random.default_rng(1)
    scorer = StragglerScorer(nodes, names=[f"n{i}" for i in range(nodes)], params=StragglerParams(learn_steps=4))
    named = []
    for step in range(steps):
        times = 1.0 + rng.normal(0, 0.003, nodes)
        if step >= 4:
            times[5] *= slow
        named = scorer.update(times, **health)
    return scorer, named


def test_a_clearly_slow_node_is_named_with_its_numbers():
    scorer, named = run_scorer(sm_clock_ratio=[1.0] * 5 + [0.8] + [1.0] * 2, throttled=[0.0] * 5 + [1.0] + [0.0] * 2)
    (v,) = named
    assert (v.node, v.name) == (5, "n5")
    assert 1.02 <= v.slowdown <= 1.10  # the excess is clipped at z_clip sigmas, like the score
    assert v.score > scorer.params.h and v.steps_observed == 60
    assert v.sm_clock_ratio == pytest.approx(0.8) and v.throttled_share == pytest.approx(1.0)
    assert "above" in v.reason and "SM clock at 80% of nominal" in v.reason and "throttled in 100%" in v.reason
    assert v.reason.startswith(f"step time {100 * (v.slowdown - 1):.1f}% above ")
    scorer.reset()
    assert scorer.named() == [] and scorer.steps == 0 and not scorer.cusum.any()
    assert (scorer.level == 1.0).all()


def test_a_node_one_percent_slow_is_never_named():
    _, named = run_scorer(slow=1.01, steps=200)
    assert named == []


def test_nobody_is_named_while_learning_or_with_fewer_than_three_reports():
    scorer = StragglerScorer(4, params=StragglerParams(learn_steps=5))
    for _ in range(4):
        assert scorer.update([1.0, 1.0, 1.0, 5.0]) == []
    assert scorer.learning
    before = scorer.cusum.copy()
    scorer.update([np.nan, 0.0, -1.0, 5.0])
    assert (scorer.cusum == before).all()


def feed(det, values):
    v = None
    for x in values:
        v = det.update(x)
    return v


def test_slowdown_learns_its_baseline_after_warmup():
    det = SlowdownDetector(drop=0.1, warmup=2, baseline_steps=3, window=2, sustain=2)
    v = feed(det, [1.0, 1.0, 100.0, 102.0, 98.0])  # the first two are warm-up
    assert v.state is SlowdownState.LEARNING and det.baseline == 100.0
    assert (v.recent, v.drop, v.steps_below) == (None, None, 0)
    assert feed(SlowdownDetector(warmup=0, baseline_steps=1), [7.0]).baseline == 7.0


def test_a_sustained_drop_is_slow_and_a_brief_one_is_not():
    det = SlowdownDetector(drop=0.1, warmup=0, baseline_steps=2, window=2, sustain=2)
    feed(det, [100.0, 100.0])
    v = det.update(90.0)  # window not full yet
    assert v.state is SlowdownState.NORMAL and v.steps_below == 0 and v.recent == 90.0
    v = det.update(90.0)  # recent median 90 = exactly 10 % below: counts
    assert (v.state, v.steps_below) == (SlowdownState.NORMAL, 1)
    v = det.update(90.0)
    assert (v.state, v.steps_below, v.drop) == (SlowdownState.SLOW, 2, pytest.approx(0.1))
    assert v.reason == "throughput 90 (median of last 2 steps) is 10.0% below the baseline 100, for 2 steps"
    v = det.update(100.0)  # median 95: back above the threshold
    assert (v.state, v.steps_below) == (SlowdownState.NORMAL, 0)
    assert v.reason == "throughput 95 (median of last 2 steps) is 5.0% below the baseline 100"


def test_slowdown_ignores_bad_values_and_forgets_on_reset():
    det = SlowdownDetector(drop=0.1, warmup=0, baseline_steps=1, window=1, sustain=1)
    feed(det, [100.0, float("nan"), 0.0, -5.0, float("inf")])
    assert det.seen == 1
    assert det.update(50.0).state is SlowdownState.SLOW
    det.reset()
    assert det.verdict().state is SlowdownState.LEARNING and det.baseline is None and det.below == 0


@pytest.mark.parametrize(
    "bad",
    [
        dict(drop=0.0),
        dict(drop=-0.1),
        dict(drop=1.0),
        dict(warmup=-1),
        dict(baseline_steps=0),
        dict(window=0),
        dict(sustain=0),
    ],
)
def test_slowdown_settings_are_checked(bad):
    with pytest.raises(ValueError):
        SlowdownDetector(**bad)


def test_params_and_verdicts_are_immutable_values():
    _, named = run_scorer()
    slow = SlowdownDetector().verdict()
    for value in (StragglerParams(), named[0], slow):
        with pytest.raises(dataclasses.FrozenInstanceError):
            value.reason = "changed"  # type: ignore[misc]


def test_a_node_missing_reports_does_not_hide_a_slow_one_nor_move_its_own_score():
    full, _ = run_scorer(steps=80)
    rng = np.random.default_rng(1)
    gappy = StragglerScorer(8, names=[f"n{i}" for i in range(8)], params=StragglerParams(learn_steps=4))
    named = []
    for step in range(80):
        times = 1.0 + rng.normal(0, 0.003, 8)
        if step >= 4:
            times[5] *= 1.10
        if step >= 10:
            times[0] = np.nan  # node 0 stops reporting
        named = gappy.update(times)
    assert [v.name for v in named] == ["n5"]
    assert named[0].slowdown == pytest.approx(full.named()[0].slowdown, abs=0.005)
    assert gappy.observed[0] == 10 and gappy.observed[5] == 80
    assert named[0].score == pytest.approx(2 * gappy.params.h)  # capped at twice the threshold


def test_health_signals_are_smoothed_from_their_first_value():
    scorer = StragglerScorer(3)
    scorer.update([1.0, 1.0, 1.0], sm_clock_ratio=[1.0, np.nan, 1.0], throttled=[0.0, 0.0, 1.0])
    scorer.update([1.0, 1.0, 1.0], sm_clock_ratio=[0.5, 0.8, np.nan], throttled=[1.0, 0.0, 1.0])
    assert scorer.clock[0] == pytest.approx(0.95) and scorer.clock[1] == 0.8 and scorer.clock[2] == 1.0
    assert scorer.throttle.tolist() == pytest.approx([0.1, 0.0, 1.0])
