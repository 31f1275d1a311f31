"""Issue 20: divergence without a jump (the trend rule), spikes judged by their trajectory (plateau,
aftershocks, slow heals within a cap), decision latency, and the seeded synthetic case set."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from supervisor.domain.progress import ProgressRecord, parse_text
from supervisor.domain.spikes.detector import SpikeDetector
from supervisor.domain.spikes.divergence import mann_kendall_z, theil_sen_slope
from supervisor.domain.spikes.events import Decision, SpikeKind, SpikeOutcome, SpikeSettings, SpikeStatus, decide
from supervisor.sim.faults.spike_shapes import PATTERNS, case_set, generate

CASES = Path(__file__).resolve().parents[1] / "data" / "spike_cases"


def trace(
    excess: np.ndarray, grad_mult: np.ndarray, seed: int, *, level: float = 2.5, noise: float = 0.008
) -> list[ProgressRecord]:
    """One record per step from 10,000 on: loss = level x (1 + excess) with noise, grad norm 0.3 x
    grad_mult with log-normal noise."""
    rng = np.random.default_rng(seed)
    loss = level * (1 + excess) * (1 + noise * rng.standard_normal(len(excess)))
    grad = 0.3 * grad_mult * 10 ** (0.05 * rng.standard_normal(len(excess)))
    return [ProgressRecord(step=10_000 + i, loss=float(v), grad_norm=float(g)) for i, (v, g) in enumerate(zip(loss, grad, strict=True))]  # fmt: skip


def rollbacks(records: list[ProgressRecord], s: SpikeSettings | None = None) -> list[SpikeOutcome]:
    notices = SpikeDetector(s).feed_all(records)
    return [n for n in notices if isinstance(n, SpikeOutcome) and n.decision is Decision.ROLLBACK]


def climb(pre: int, span: int, rise: float, grad_x: float) -> tuple[np.ndarray, np.ndarray]:
    x = np.clip((np.arange(pre + span) - pre) / span, 0, None)
    return rise * x, grad_x**x


def plateau(pre: int, level: float, grad_x: float, n: int = 250) -> tuple[np.ndarray, np.ndarray]:
    """A spike to x2.2 at ``pre`` that falls within 10 steps to ``level`` above and stays there."""
    t = np.arange(pre + n) - pre
    fall = np.clip(1 - t / 10, 0, 1)
    excess = np.where(t >= 0, level + (1.2 - level) * fall, 0.0)
    return excess, np.where(t >= 0, grad_x + (50 - grad_x) * fall, 1.0)


# ---------------------------------------------------------------------------- rank statistics


def test_mann_kendall_and_theil_sen() -> None:
    up = np.arange(20, dtype=float)
    assert mann_kendall_z(up) > 5 and mann_kendall_z(-up) < -5
    assert mann_kendall_z(np.ones(20)) == 0.0 and mann_kendall_z(up[:2]) == 0.0
    y = 0.5 * up + 1
    y[7] = 100.0  # one outlier does not move the robust slope
    assert theil_sen_slope(up, y) == pytest.approx(0.5)
    assert theil_sen_slope(np.ones(4), up[:4]) == 0.0


# ---------------------------------------------------------------------------- item 1: trends


@pytest.mark.parametrize("seed", range(4))
def test_a_steady_climb_from_1_58_to_3_over_150_steps_is_divergence(seed: int) -> None:
    """The issue's example: no single jump, so the jump rules say "no spike" (old code: nothing)."""
    excess, grad = climb(300, 150, 3.0 / 1.58 - 1, 10.0)
    out = rollbacks(trace(excess, grad, seed, level=1.58))[0]
    assert out.rule == "trend" and out.event.kind is SpikeKind.TREND and out.status is SpikeStatus.DIVERGED
    assert 10_300 - 5 <= out.event.onset_step <= 10_300 + 20  # where the climb began, for the checkpoint
    assert out.steps_after_onset <= 50 and out.decided_step - 10_300 <= 50
    assert out.figures["mann_kendall_z"] >= 3 and out.figures["rise_pct"] >= 8  # type: ignore[operator]
    assert "loss climbing since step" in out.reason and "Mann-Kendall" in out.reason


def test_a_smaller_climb_counts_when_the_grad_norm_climbs_with_it() -> None:
    excess, grad = climb(300, 60, 0.06, 20.0)  # +6 % only: below trend_min_rise alone
    assert rollbacks(trace(excess, grad, 1, noise=0.003), SpikeSettings(trend_detection=False)) == []
    (out,) = rollbacks(trace(excess, grad, 1, noise=0.003))
    assert out.rule == "trend" and out.figures["grad_ratio"] >= 4  # type: ignore[operator]


@pytest.mark.parametrize("seed", range(4))
def test_noise_and_a_falling_loss_are_no_trend(seed: int) -> None:
    n = 3000
    excess = 0.3 * (1 - np.arange(n) / n) ** 2  # training: the loss falls, ever more slowly
    assert rollbacks(trace(excess, np.ones(n), seed, noise=0.015)) == []


def test_the_level_left_by_a_healed_spike_is_not_a_trend() -> None:
    """A slow heal ends inside the band but above the pre-spike level: comparing what follows with
    the pre-spike reference would call that a climb (found by the synthetic slow heals)."""
    n, pre = 1200, 300
    t = np.arange(n) - pre
    excess = np.where(t >= 0, 1.0 * np.exp(-np.clip(t, 0, None) / 60) + 0.04 * (t < 700), 0.0)
    assert rollbacks(trace(excess, np.ones(n), 3)) == []


# ---------------------------------------------------------------------------- item 2: trajectories


@pytest.mark.parametrize("seed", range(3))
def test_a_plateau_with_elevated_grad_norm_is_rolled_back_early(seed: int) -> None:
    """+12 % with grad norm x4 was left for the whole 200-step window before (old code: not_healed
    at 201 steps)."""
    excess, grad = plateau(300, 0.12, 4.0)
    (out,) = rollbacks(trace(excess, grad, seed))
    assert out.rule == "plateau" and out.status is SpikeStatus.NOT_HEALED and out.event.onset_step == 10_300
    assert out.steps_after_onset <= 50
    assert out.figures["grad_ratio"] >= 3 and 8 <= out.figures["level_pct"] <= 16  # type: ignore[operator]
    assert "not coming down" in out.reason and "grad norm x" in out.reason


def test_a_plateau_with_aftershocks_is_rolled_back_early() -> None:
    excess, grad = plateau(300, 0.12, 1.5)  # grad norm not elevated enough by itself
    excess[340:343] += 0.5
    (out,) = rollbacks(trace(excess, grad, 7))
    assert out.rule == "aftershock" and out.figures["aftershocks"] == 1 and out.steps_after_onset <= 80
    assert "aftershock(s)" in out.reason


def test_a_plateau_without_evidence_waits_for_the_fixed_window() -> None:
    excess, grad = plateau(300, 0.12, 1.0)
    (out,) = rollbacks(trace(excess, grad, 2))
    assert out.rule == "not_healed" and out.steps_after_onset == SpikeSettings().heal_window_steps + 1


@pytest.mark.parametrize("seed", range(3))
def test_a_bloom13b_like_slow_heal_is_left_alone(seed: int) -> None:
    """x3 and ~500 steps to heal, grad norm x10 decaying: old code rolled it back at 200 steps."""
    n, pre = 1100, 200
    t = np.clip(np.arange(n) - pre, 0, None)
    excess = np.where(np.arange(n) >= pre, 2.1 * np.exp(-t / 115), 0.0)
    grad = 1 + np.where(np.arange(n) >= pre, 9 * np.exp(-t / 60), 0.0)
    notices = SpikeDetector().feed_all(trace(excess, grad, seed))
    assert decide(notices) is Decision.LEAVE
    (healed,) = [n for n in notices if isinstance(n, SpikeOutcome) and n.event.kind is SpikeKind.LOSS]
    assert healed.rule == "healed" and 300 <= healed.steps_after_onset <= 700


def test_a_spike_returning_too_slowly_for_the_cap_is_rolled_back_by_the_cap() -> None:
    n, pre = 1400, 100
    t = np.clip(np.arange(n) - pre, 0, None)
    excess = np.where(np.arange(n) >= pre, 1.0 - 0.85 * t / 1300, 0.0)  # back in band after ~1250 steps
    (out,) = rollbacks(trace(excess, np.ones(n), 4, noise=0.003), SpikeSettings(heal_cap_steps=600))
    assert out.rule == "not_healed" and 201 <= out.steps_after_onset <= 601


def test_a_spike_logged_across_two_records_is_not_a_creeping_divergence() -> None:
    """Megatron averages the loss over the log interval, so a spike shows on a partial record and
    then a higher full one; with two noisy rises before it that was "rose on 4 consecutive records"
    (old code: diverged)."""
    losses = [2.0, 2.01, 1.99, 2.0, 1.995, 2.0, 2.004, 2.008, 2.6, 3.3, 2.5, 2.1, 2.0, 2.0]
    recs = [ProgressRecord(step=1000 + 10 * i, loss=v) for i, v in enumerate(losses)]
    notices = SpikeDetector().feed_all(recs)
    assert decide(notices) is Decision.LEAVE
    assert [n.rule for n in notices if isinstance(n, SpikeOutcome)] == ["healed"]


def test_the_issue6_rules_remain_available_as_the_baseline() -> None:
    excess, grad = plateau(300, 0.12, 4.0)
    (out,) = rollbacks(trace(excess, grad, 0), SpikeSettings(early_decisions=False, trend_detection=False))
    assert out.rule == "not_healed" and out.steps_after_onset == 201


# ---------------------------------------------------------------------------- real excerpts


def test_a_spike_right_after_a_resume_is_waited_on() -> None:
    """tr8b-104B 17062: 2.7 -> 4.4 right after a resume, "then quickly recovering to 2.7"."""
    notices = SpikeDetector().feed_all(parse_text((CASES / "tr8b_104b_resume_spike_L445-462.log").read_text()))
    assert decide(notices) is Decision.LEAVE and notices[0].onset_step == 17062  # type: ignore[union-attr]


def test_the_climb_of_a_real_megatron_run_is_found() -> None:
    """BigScience's throughput test: after the warm-up spike heals the loss climbs 11.65 -> 20.4."""
    recs = parse_text((CASES / "megds_gpt2_3d_n16_L740-984.out").read_text())
    (out,) = rollbacks(recs)
    assert out.rule == "trend" and 31 <= out.event.onset_step <= 40 and out.decided_step <= 60


# ---------------------------------------------------------------------------- item 3: the case set


def test_the_synthetic_case_set_is_seeded_and_covers_every_pattern() -> None:
    assert generate("slow_heal", 3).records == generate("slow_heal", 3).records
    assert generate("slow_heal", 3).params != generate("slow_heal", 4).params
    cases = case_set(2)
    assert {c.pattern for c in cases} == set(PATTERNS) and len(cases) == 2 * len(PATTERNS)
    for c in cases:
        assert (c.onset_step is None) == (c.pattern in {"healthy", "grad_norm_only"})
        assert all(r.loss is not None and math.isfinite(r.loss) for r in c.records)


@pytest.mark.parametrize("case", case_set(2, first_seed=500), ids=lambda c: c.name)
def test_held_out_synthetic_cases_get_the_expected_decision(case) -> None:  # type: ignore[no-untyped-def]
    """Seeds the bench does not use (it runs 0..7): the rules were not tuned on these."""
    notices = SpikeDetector().feed_all(list(case.records))
    assert decide(notices) is case.expected
    if case.expected is Decision.ROLLBACK:
        first = next(n for n in notices if isinstance(n, SpikeOutcome) and n.decision is Decision.ROLLBACK)
        assert (
            first.event.onset_step - SpikeSettings().min_steps_before < case.onset_step
            and first.decided_step - case.onset_step <= 150
        )
