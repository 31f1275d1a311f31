"""HangDetector (supervisor.domain.progress.hang) on seeded synthetic traces, plus properties.

A trace is simulated as a trainer that logs every ``stride`` steps, read by a poller that checks
every ``tick`` seconds: each poll observes the steps logged since the last one, all at the poll's
time (as the engine would after reading the tail), then calls ``check``.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.domain.progress.hang import HangDetector, HangSettings, HangVerdict


def log_times(rng: random.Random, n: int, step_s: float, noise: float, start: float = 0.0) -> list[float]:
    """Times at which steps 1..n finish: log-normal noise around ``step_s``."""
    t, out = start, []
    for _ in range(n):
        t += step_s * rng.lognormvariate(0.0, noise)
        out.append(t)
    return out


def run_polled(
    det: HangDetector, finish: list[float], *, stride: int, tick: float, until: float, first_step: int = 1
) -> list[tuple[float, HangVerdict]]:
    """Poll every ``tick`` s up to ``until``; feed logged steps; the verdicts seen, with poll time."""
    verdicts: list[tuple[float, HangVerdict]] = []
    i = 0
    now = 0.0
    while now < until:
        now += tick
        while i < len(finish) and finish[i] <= now:
            step = first_step + i
            if step % stride == 0:
                det.observe(step, now)
            i += 1
        verdict = det.check(now)
        if verdict is not None:
            verdicts.append((now, verdict))
    return verdicts


@pytest.mark.parametrize(
    ("seed", "step_s", "noise", "stride", "tick"),
    [(1, 1.0, 0.1, 10, 5.0), (2, 0.3, 0.3, 1, 2.0), (3, 12.0, 0.2, 5, 10.0), (4, 3.0, 0.5, 1, 1.0)],
)
def test_steady_noisy_steps_never_flag(seed: int, step_s: float, noise: float, stride: int, tick: float) -> None:
    rng = random.Random(seed)
    n = 100_000
    finish = log_times(rng, n, step_s, noise)
    det = HangDetector(started_at=0.0)
    verdicts = run_polled(det, finish, stride=stride, tick=tick, until=finish[-1])
    assert verdicts == []
    assert det.interval_s is not None
    assert det.interval_s == pytest.approx(step_s * stride, rel=0.3)


@pytest.mark.parametrize("seed", range(5))
def test_stop_flags_within_threshold_plus_one_tick(seed: int) -> None:
    rng = random.Random(seed)
    step_s = rng.uniform(5.0, 120.0)
    tick = rng.uniform(1.0, 15.0)
    stride = rng.choice([1, 5, 10])
    finish = log_times(rng, 2000, step_s, 0.1)
    stop = finish[1500]  # the trainer freezes after step 1501
    det = HangDetector(started_at=0.0)
    verdicts = run_polled(det, finish[:1501], stride=stride, tick=tick, until=stop + 3 * 1800 + 2 * tick)
    assert verdicts, "a frozen trainer must be flagged"
    first_at, verdict = verdicts[0]
    threshold = verdict.threshold_s
    assert verdict.learned
    last_logged = max(s for s in range(1, 1502) if s % stride == 0)
    assert verdict.last_step == last_logged
    last_seen = math.ceil(finish[last_logged - 1] / tick) * tick  # the poll that read it
    assert last_seen + threshold < first_at <= last_seen + threshold + tick + 1e-6
    s = HangSettings()
    assert threshold == pytest.approx(min(max(s.multiple * verdict.interval_s, s.floor_s), s.cap_s))  # type: ignore[operator]
    assert first_at - stop <= threshold + stride * step_s * 1.5 + tick
    assert f"after step {last_logged}" in verdict.reason
    assert verdict.since_s > threshold


def test_fast_steps_detected_at_the_floor() -> None:
    det = HangDetector(started_at=0.0)
    t = 0.0
    for step in range(1, 200):
        t += 1.0
        det.observe(step, t)
    assert det.interval_s == pytest.approx(1.0)
    assert det.check(t + 120.0) is None
    verdict = det.check(t + 121.0)
    assert verdict is not None and verdict.threshold_s == 120.0
    assert "raised to the 120 s floor" in verdict.reason


def test_slow_steps_capped() -> None:
    det = HangDetector(started_at=0.0)
    for step in range(1, 20):
        det.observe(step, step * 600.0)
    assert det.threshold_s() == (1800.0, True)
    verdict = det.check(19 * 600.0 + 1801.0)
    assert verdict is not None and "capped at 1800 s" in verdict.reason


def test_slow_warm_up_does_not_flag() -> None:
    """Start-up takes 20 minutes, the first steps are ten times slower, then steady 2 s steps."""
    rng = random.Random(7)
    det = HangDetector(started_at=0.0)
    t = 1200.0  # no step before: inside the start-up grace
    assert det.check(t) is None
    step = 0
    for slow in [300.0, 200.0, 100.0, 40.0, 20.0]:  # compilation, autotuning, cache warm-up
        t += slow
        step += 1
        det.observe(step, t)
        assert det.check(t + slow * 0.9) is None
    for _ in range(2000):
        t += 2.0 * rng.lognormvariate(0.0, 0.1)
        step += 1
        det.observe(step, t)
        assert det.check(t) is None
    assert det.interval_s == pytest.approx(2.0, rel=0.1)


def test_no_step_at_all_flags_after_startup_grace() -> None:
    det = HangDetector(started_at=100.0)
    assert det.check(100.0 + 1800.0) is None
    verdict = det.check(100.0 + 1801.0)
    assert verdict is not None
    assert verdict.last_step is None and not verdict.learned and verdict.interval_s is None
    assert "after the attempt started" in verdict.reason and "start-up grace" in verdict.reason


def test_checkpoint_pause_shorter_than_threshold_does_not_flag() -> None:
    """Steps of 30 s (threshold 150 s); every 500 steps a checkpoint save adds 100 s (a gap of 130 s)."""
    rng = random.Random(11)
    det = HangDetector(started_at=0.0)
    t = 0.0
    for step in range(1, 5001):
        t += 30.0 * rng.lognormvariate(0.0, 0.03) + (100.0 if step % 500 == 0 else 0.0)
        for probe in (t - 1.0, t - 60.0):
            assert det.check(probe) is None, step
        det.observe(step, t)
    assert det.interval_s == pytest.approx(30.0, rel=0.05)  # the pauses do not move the median


def test_backlog_read_in_one_poll_learns_the_real_pace() -> None:
    """A daemon adopting a running job reads hours of log at once, then follows it live."""
    det = HangDetector(started_at=0.0)
    for step in range(1, 1001):
        det.observe(step, 5000.0)  # all read at the same time
    t = 5000.0
    for step in range(1001, 1101):
        t += 10.0  # a poll every 10 s brings 5 steps of 2 s
        for s in range(5):
            det.observe(step * 5 + s, t)
    assert det.interval_s == pytest.approx(2.0)
    assert det.check(t + 120.0) is None and det.check(t + 121.0) is not None


def test_reset_starts_a_new_attempt() -> None:
    det = HangDetector(started_at=0.0)
    for step in range(1, 100):
        det.observe(step, step * 1.0)
    assert det.interval_s is not None
    det.reset(1000.0)
    assert det.interval_s is None and det.last_step is None
    assert det.check(1000.0 + 1799.0) is None  # the grace again, not the 120 s floor
    assert det.check(1000.0 + 1801.0) is not None


def test_step_going_back_restarts_the_count_but_keeps_the_pace() -> None:
    det = HangDetector(started_at=0.0)
    for step in range(1, 100):
        det.observe(step, step * 1.0)
    det.observe(50, 500.0)  # resumed from the checkpoint at step 50 within the same job
    assert det.last_step == 50
    assert det.check(500.0 + 120.0) is None
    assert det.check(500.0 + 121.0) is not None
    det.observe(51, 501.0)
    assert det.check(501.0 + 100.0) is None


def test_repeated_steps_are_not_progress() -> None:
    det = HangDetector(started_at=0.0)
    for step in range(1, 50):
        det.observe(step, float(step))
    for t in range(50, 400, 5):  # eight ranks keep printing the same step: still a hang
        det.observe(49, float(t))
    verdict = det.check(400.0)
    assert verdict is not None and verdict.last_step == 49 and verdict.since_s == pytest.approx(351.0)


def test_without_start_time_nothing_is_judged_until_a_step() -> None:
    det = HangDetector()
    assert det.check(1e9) is None
    det.observe(None, 10.0)
    assert det.check(1e9) is None
    det.observe(3, 10.0)
    assert det.check(10.0 + 1801.0) is not None


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="floor_s"):
        HangSettings(floor_s=2000.0, cap_s=1800.0)
    with pytest.raises(ValueError, match="multiple"):
        HangSettings(multiple=0.0)
    with pytest.raises(ValueError, match="min_samples"):
        HangSettings(min_samples=10, window=5)
    with pytest.raises(ValueError, match="skip_samples"):
        HangSettings(skip_samples=-1)


def test_custom_settings() -> None:
    det = HangDetector(HangSettings(multiple=2.0, floor_s=1.0, cap_s=100.0, min_samples=3, skip_samples=0))
    for step in range(1, 10):
        det.observe(step, step * 4.0)
    assert det.threshold_s() == (8.0, True)
    assert det.check(36.0 + 8.0) is None and det.check(36.0 + 8.5) is not None


# ---------------------------------------------------------------------------- properties

events = st.lists(
    st.one_of(
        st.tuples(st.just("observe"), st.one_of(st.none(), st.integers(-5, 10**6)), st.floats(allow_nan=True)),
        st.tuples(st.just("check"), st.none(), st.floats(allow_nan=True, allow_infinity=True)),
        st.tuples(st.just("reset"), st.none(), st.one_of(st.none(), st.floats())),
    ),
    max_size=200,
)


@settings(max_examples=300, deadline=None)
@given(events)
def test_never_raises_and_verdicts_only_past_the_threshold(ops: list[tuple[str, int | None, float | None]]) -> None:
    det = HangDetector(HangSettings(min_samples=2, skip_samples=1, window=8))
    for op, step, at in ops:
        if op == "observe":
            assert at is not None
            det.observe(step, at)
        elif op == "reset":
            det.reset(at)
        else:
            assert at is not None
            verdict = det.check(at)
            threshold, learned = det.threshold_s()
            if verdict is not None:
                assert verdict.since_s > verdict.threshold_s == threshold
                assert verdict.learned == learned
                assert verdict.reason
            s = det.settings
            assert threshold == s.startup_grace_s or s.floor_s <= threshold <= s.cap_s


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0.01, 1000.0), min_size=1, max_size=60),
    st.floats(0.0, 5000.0),
)
def test_verdict_exactly_when_gap_exceeds_threshold(gaps: list[float], wait: float) -> None:
    det = HangDetector(HangSettings(min_samples=2, skip_samples=1, window=16), started_at=0.0)
    t = 0.0
    for step, gap in enumerate(gaps, start=1):
        t += gap
        det.observe(step, t)
    threshold, _ = det.threshold_s()
    verdict = det.check(t + wait)
    silence = (t + wait) - t  # the gap as the detector measures it (floats: not always ``wait``)
    assert (verdict is not None) == (silence > threshold)


def test_an_announced_checkpoint_save_is_not_a_hang_until_its_cap() -> None:
    from supervisor.domain.progress.pauses import ends_pause, pause_of

    det = HangDetector(HangSettings(multiple=5, floor_s=60, cap_s=600, pause_cap_s=1800), started_at=0.0)
    t = 0.0
    for step in range(1, 41):
        t += 10.0
        det.observe(step, t)
    threshold, learned = det.threshold_s()
    assert learned and threshold == 60.0  # 5 x 10 s, at the floor
    line = " saving checkpoint at iteration      40 to /lustre/ckpt"
    what = pause_of(line)
    assert what == "a checkpoint save" and not ends_pause(line)
    det.pause(what)
    assert det.check(t + 900) is None  # a 15-minute synchronous save
    verdict = det.check(t + 1801)
    assert verdict is not None and "while a checkpoint save" in verdict.reason
    assert ends_pause(" successfully saved checkpoint at iteration      40 to /lustre/ckpt")
    det.unpause()
    assert det.check(t + 61) is not None  # without the announcement the floor applies again
    det.pause("a checkpoint save")
    det.observe(41, t + 70)  # the next step ends the pause
    assert det.threshold_s()[0] == 60.0
