"""Loss-spike detection: the real BigScience cases with the humans' decisions, seeded synthetic
traces, the rollback-policy helpers, and a property test that the detector never raises."""

from __future__ import annotations

import csv
import math
import random
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.domain.progress import ProgressRecord, parse_text
from supervisor.domain.spikes.detector import SpikeDetector
from supervisor.domain.spikes.events import (
    Decision,
    SpikeKind,
    SpikeOutcome,
    SpikeSettings,
    SpikeStatus,
    decide,
)
from supervisor.domain.spikes.rollback import choose_rollback, plan_rollback, suggest_skip

DATA = Path(__file__).resolve().parents[1] / "data"
LOGS = DATA / "train_logs"
CASES = DATA / "spike_cases"

# excerpt -> case_id in human_decisions.csv (see tests/data/spike_cases/README.md)
REAL = {
    "bloom176b_spike_iter31214-31251.log": "bloom176_spike1",
    "bloom13b_spike_iter29020-29090.log": "bloom13b_spike",
    "tr8_104b_exp1_glitch_iter7000-7220.log": "tr8_104b_exp1",
    "tr8_104b_exp2_glitch_iter6900-6940.log": "tr8_104b_exp2",
    "tr8_104b_exp11_spike_iter11446-11448.log": "tr8_104b_exp11",
    "tr8_104b_exp12_spike_then_divergence_iter8738-9027.log": "tr8_104b_exp12",
}


def human_decisions() -> dict[str, Decision]:
    lines = [ln for ln in (CASES / "human_decisions.csv").read_text().splitlines() if ln and not ln.startswith("#")]
    out = {}
    for row in csv.DictReader(lines, delimiter="|"):
        none = row["human_action"].strip().lower().startswith("none")
        out[row["case_id"]] = Decision.LEAVE if none else Decision.ROLLBACK
    return out


def run(records: list[ProgressRecord], s: SpikeSettings | None = None) -> tuple[SpikeDetector, list]:
    det = SpikeDetector(s)
    return det, det.feed_all(records)


def outcomes(notices: list) -> list[SpikeOutcome]:
    return [n for n in notices if isinstance(n, SpikeOutcome)]


# ---------------------------------------------------------------------------- real cases


@pytest.mark.parametrize("excerpt", sorted(REAL))
def test_real_case_matches_human_decision(excerpt: str) -> None:
    human = human_decisions()[REAL[excerpt]]
    _, notices = run(parse_text((LOGS / excerpt).read_text()))
    assert decide(notices) is human


def test_bloom176b_31216_heals_by_itself() -> None:
    _, notices = run(parse_text((LOGS / "bloom176b_spike_iter31214-31251.log").read_text()))
    (out,) = outcomes(notices)
    assert out.status is SpikeStatus.HEALED and out.decision is Decision.LEAVE
    assert out.event.onset_step == 31216 and out.peak_step == 31219
    assert out.peak_z is not None and out.peak_z > 20
    assert 30 <= out.steps_after_onset <= 40
    assert "leave it" in out.reason


def test_bloom13b_29050_is_waited_on() -> None:
    det, notices = run(parse_text((LOGS / "bloom13b_spike_iter29020-29090.log").read_text()))
    assert outcomes(notices) == []
    assert det.open_spike is not None and det.open_spike.onset_step == 29050


def test_exp2_creeping_divergence_rolls_back_without_waiting() -> None:
    _, notices = run(parse_text((LOGS / "tr8_104b_exp2_glitch_iter6900-6940.log").read_text()))
    (out,) = outcomes(notices)
    assert out.status is SpikeStatus.DIVERGED and out.rule == "diverged" and out.decided_step == 6940


def test_exp12_missing_loss_is_nonfinite() -> None:
    _, notices = run(parse_text((LOGS / "tr8_104b_exp12_spike_then_divergence_iter8738-9027.log").read_text()))
    rules = [o.rule for o in outcomes(notices)]
    assert rules == ["not_healed", "nonfinite"]


def test_healthy_stretch_of_real_log_never_rolls_back() -> None:
    for name in ("bloom176b_throughput_drop_iter42780-42784_wrapped.log", "megds_gpt2_3d_n16_L740-900.out"):
        _, notices = run(parse_text((LOGS / name).read_text()))
        assert decide(notices) is Decision.LEAVE, name


def test_loss_scale_halving_streak() -> None:
    recs = parse_text((LOGS / "tr8b_104b_overflow_L445-462.log").read_text())
    _, notices = run(recs, SpikeSettings(loss_scale_max_halvings=5))
    kinds = [o.event.kind for o in outcomes(notices) if o.decision is Decision.ROLLBACK]
    assert SpikeKind.LOSS_SCALE in kinds


# ---------------------------------------------------------------------------- synthetic


def trace(n: int, seed: int, *, start: int = 1000, base: float = 2.5, noise: float = 0.01) -> list[float]:
    rng = random.Random(seed)
    return [base * (1 + rng.gauss(0, noise)) for _ in range(n)]


def records(losses: list[float], start: int = 1000, every: int = 1) -> list[ProgressRecord]:
    return [ProgressRecord(step=start + i * every, loss=v) for i, v in enumerate(losses)]


def spike(losses: list[float], at: int, height: float, heal_steps: int | None) -> list[float]:
    out = list(losses)
    for i in range(at, len(out)):
        k = i - at
        if heal_steps is None:
            out[i] += height
        elif k < heal_steps:
            out[i] += height * (1 - k / heal_steps)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_noise_alone_raises_nothing(seed: int) -> None:
    _, notices = run(records(trace(2000, seed)))
    assert notices == []


@pytest.mark.parametrize("seed", range(5))
def test_spike_healing_in_30_steps_is_left_alone(seed: int) -> None:
    _, notices = run(records(spike(trace(300, seed), 150, 3.0, 30)))
    (out,) = outcomes(notices)
    assert out.decision is Decision.LEAVE and out.event.onset_step == 1150
    assert out.steps_after_onset <= 40


@pytest.mark.parametrize("seed", range(5))
def test_spike_that_does_not_heal_rolls_back(seed: int) -> None:
    _, notices = run(records(spike(trace(600, seed), 150, 1.5, None)))
    (out,) = outcomes(notices)
    assert out.decision is Decision.ROLLBACK and out.status is SpikeStatus.NOT_HEALED
    assert out.decided_step == 1150 + SpikeSettings().heal_window_steps + 1


def test_nan_rolls_back() -> None:
    losses = trace(100, 1)
    losses[60] = math.nan
    _, notices = run(records(losses))
    (out,) = outcomes(notices)
    assert out.decision is Decision.ROLLBACK and out.event.kind is SpikeKind.NONFINITE
    assert out.event.onset_step == 1060


def test_loss_scale_floor() -> None:
    recs = [ProgressRecord(step=i, loss=2.0, loss_scale=2.0 ** (10 - i)) for i in range(12)]
    _, notices = run(recs, SpikeSettings(loss_scale_max_halvings=100))
    (out,) = outcomes(notices)
    assert out.rule == "loss_scale_floor" and out.event.onset_step == 10


def test_grad_norm_spike_alone_is_logged_and_left() -> None:
    recs = [ProgressRecord(step=i, loss=2.0, grad_norm=0.3 * (1 + 0.05 * math.sin(i))) for i in range(40)]
    recs[20] = ProgressRecord(step=20, loss=2.0, grad_norm=200.0)
    _, notices = run(recs)
    (out,) = outcomes(notices)
    assert out.event.kind is SpikeKind.GRAD_NORM and out.decision is Decision.LEAVE
    # the reason says how many times the baseline it jumped
    assert "200 vs baseline median 0.3011 (x664, z 28.2 on log10)" in out.event.reason
    assert out.event.baseline == pytest.approx(0.3011, abs=1e-4)
    assert out.reason.startswith("grad norm back to 0.2999 2 steps after onset, peak 200 at step 20")


def test_out_of_order_and_stepless_records_are_ignored() -> None:
    det = SpikeDetector()
    assert det.feed(ProgressRecord(step=None, loss=1.0)) == []
    det.feed(ProgressRecord(step=10, loss=1.0))
    assert det.feed(ProgressRecord(step=5, loss=100.0)) == []


# ---------------------------------------------------------------------------- rollback policy


def test_choose_rollback() -> None:
    ckpts = [0, 100, 200, 300, 400]
    assert choose_rollback(450, ckpts, 100) == 300
    assert choose_rollback(400, ckpts, 100) == 300
    assert choose_rollback(50, ckpts, 100) is None
    assert choose_rollback(450, [], 0) is None


def test_suggest_skip_and_plan() -> None:
    s = SpikeSettings(skip_batches=300, skip_past_onset=50)
    assert suggest_skip(6900, 7010, s).as_megatron() == "6901-7200"
    assert suggest_skip(100, 1000, s).as_megatron() == "101-1050"
    _, notices = run(parse_text((LOGS / "tr8_104b_exp1_glitch_iter7000-7220.log").read_text()))
    (out,) = outcomes(notices)
    plan = plan_rollback(out, list(range(0, 7300, 100)), s)
    assert plan is not None and plan.checkpoint_step == 6900 and plan.checkpoint_step < out.event.onset_step
    assert plan.skip.batches == 300 and "6901-7200" in plan.reason


def test_settings_and_results_are_frozen() -> None:
    s = SpikeSettings()
    with pytest.raises(FrozenInstanceError):
        s.window = 3  # type: ignore[misc]
    with pytest.raises(ValueError):
        SpikeSettings(window=0)


# ---------------------------------------------------------------------------- property

values = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-10, max_value=20),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), values, values, values), max_size=120))
def test_never_raises(rows: list[tuple[int, float | None, float | None, float | None]]) -> None:
    det = SpikeDetector(SpikeSettings(window=7, heal_window_steps=5))
    step = 0
    for gap, loss, grad, scale in rows:
        step += gap
        for n in det.feed(ProgressRecord(step=step, loss=loss, grad_norm=grad, loss_scale=scale)):
            assert n.reason
    decide([])


def test_a_constant_loss_scale_of_one_is_bf16_not_a_collapse() -> None:
    recs = [ProgressRecord(step=i, loss=2.0 - i * 1e-3, loss_scale=1.0) for i in range(200)]
    _, notices = run(recs, SpikeSettings())
    assert notices == []


def test_a_jump_must_also_be_large_relative_to_the_loss() -> None:
    """``min_rel_jump``: with a tight noise floor a 5 % jump is many sigmas, yet no spike; 15 % is."""
    tight = SpikeSettings(rel_sigma_floor=0.001)
    for jump, spiked in ((0.10, False), (0.30, True)):
        recs = [ProgressRecord(step=i, loss=2.0) for i in range(30)]
        recs[20] = ProgressRecord(step=20, loss=2.0 + jump)
        _, notices = run(recs, tight)
        assert any(getattr(n, "kind", None) is SpikeKind.LOSS for n in notices) is spiked, (jump, notices)


def test_a_loss_spike_is_measured_in_sigmas_of_its_baseline() -> None:
    """z = (loss - median) / sigma, unrounded: 0.5 over a floor sigma of 0.04 (2 % of 2.0) is 12.5."""
    recs = [ProgressRecord(step=i, loss=2.0) for i in range(30)]
    recs[20] = ProgressRecord(step=20, loss=2.5)
    _, notices = run(recs)
    (event,) = [n for n in notices if getattr(n, "kind", None) is SpikeKind.LOSS]
    assert event.severity_z == pytest.approx(12.5) and event.baseline == 2.0
