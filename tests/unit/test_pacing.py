"""The one pacing rule of the daemon's loop and the simulator's, with plain data."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from supervisor.engine.loop.tick_delay import Cadence, NextTick, Pacing, PacingState, TickSummary, next_delay

PACING = Pacing(poll_interval_s=5.0, max_backoff_s=15.0, max_busy_ticks=5, urgent_interval_s=0.5)
QUIET = TickSummary(ok=True)
ACTED = TickSummary(ok=True, acted=True, urgent=True)  # the engine marks a tick that acted urgent
URGENT = TickSummary(ok=True, urgent=True)
FAILED = TickSummary(ok=False)


def pace(ticks: Iterable[TickSummary], pacing: Pacing = PACING) -> list[NextTick]:
    """The waits after each of ``ticks``, in a row from a fresh start."""
    state = PacingState.start(pacing)
    steps = []
    for tick in ticks:
        step, state = next_delay(pacing, state, tick)
        steps.append(step)
    return steps


def delays(ticks: Iterable[TickSummary], pacing: Pacing = PACING) -> list[float]:
    return [step.delay_s for step in pace(ticks, pacing)]


def test_a_quiet_tick_waits_one_poll_and_is_the_only_quiet_one() -> None:
    (step,) = pace([QUIET])
    assert step == NextTick(5.0, Cadence.POLL) and step.quiet
    assert not any(s.quiet for s in pace([ACTED, URGENT, FAILED]))


def test_ticks_that_act_run_back_to_back_but_never_more_than_the_cap() -> None:
    assert delays([ACTED] * 6) == [0.0, 0.0, 0.0, 0.0, 0.5, 0.5]
    assert [s.cadence for s in pace([ACTED] * 5)][-1] is Cadence.URGENT


def test_the_busy_run_starts_again_after_a_tick_that_did_not_act() -> None:
    assert delays([ACTED] * 5 + [QUIET] + [ACTED]) == [0.0, 0.0, 0.0, 0.0, 0.5, 5.0, 0.0]


def test_a_busy_tick_that_is_not_urgent_is_followed_by_a_poll_once_the_cap_is_reached() -> None:
    acted_calm = TickSummary(ok=True, acted=True)
    assert delays([acted_calm] * 5) == [0.0, 0.0, 0.0, 0.0, 5.0]


def test_urgent_ticks_come_at_the_urgent_interval_but_never_slower_than_the_poll() -> None:
    assert pace([URGENT]) == [NextTick(0.5, Cadence.URGENT)]
    slow_urgent = Pacing(poll_interval_s=2.0, urgent_interval_s=3.0)
    assert pace([URGENT], slow_urgent) == [NextTick(2.0, Cadence.URGENT)]


def test_failed_ticks_back_off_doubling_up_to_the_cap() -> None:
    assert delays([FAILED] * 4) == [10.0, 15.0, 15.0, 15.0]
    assert all(s.cadence is Cadence.BACKOFF for s in pace([FAILED] * 4))


def test_the_error_s_own_retry_advice_is_a_floor_under_the_cap() -> None:
    assert delays([TickSummary(ok=False, retry_in=12.0)]) == [12.0]
    assert delays([TickSummary(ok=False, retry_in=30.0)]) == [15.0]
    assert delays([TickSummary(ok=False, retry_in=0.1)]) == [10.0]


def test_a_good_tick_resets_the_backoff() -> None:
    assert delays([FAILED, FAILED, QUIET, FAILED]) == [10.0, 15.0, 5.0, 10.0]


def test_a_failed_tick_keeps_the_busy_count() -> None:
    # busy ticks separated by a failure still count toward the cap: a failing engine cannot reset it
    assert delays([ACTED] * 3 + [FAILED] + [ACTED] * 2) == [0.0, 0.0, 0.0, 10.0, 0.0, 0.5]


def test_the_state_is_a_value_and_the_function_pure() -> None:
    state = PacingState.start(PACING)
    first = next_delay(PACING, state, ACTED)
    assert next_delay(PACING, state, ACTED) == first  # same input, same answer
    assert state == PacingState(busy_ticks=0, backoff_s=5.0)  # the input is left as it was
    with pytest.raises(AttributeError):
        state.busy_ticks = 3  # type: ignore[misc]


def test_an_urgent_tick_waits_no_longer_than_a_suspects_confirmation():
    """A suspect node's failures span the confirmation time in 0.3 s: the next tick then, not 0.5 s on."""
    assert delays([TickSummary(ok=True, urgent=True, confirm_in=0.3)]) == [pytest.approx(0.32)]
    assert delays([TickSummary(ok=True, urgent=True, confirm_in=2.0)]) == [0.5]  # later than a tick: a tick
