"""How long to wait before the next tick: one pure rule for the daemon's loop and the simulator's.

* quiet: a tick every ``poll_interval_s``;
* busy: a tick that acted is followed at once by another (a decision's follow-up is seen without
  waiting a poll), but at most ``max_busy_ticks`` in a row so an engine that acts on every tick
  cannot spin;
* urgent: while a recovery or a suspect node is in progress, ticks come every ``urgent_interval_s``,
  or sooner when a suspect node's probes can confirm its death sooner (``confirm_in``): the probe
  that confirms it runs when its failures span the confirmation time, not up to a tick after;
* backoff: a tick that could not reach Slurm doubles the wait up to ``max_backoff_s``, and waits at
  least as long as the error asked for.

No clock and no I/O: the loops own the waiting (a real wait in the daemon, a jump of the virtual
clock in the simulator).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

__all__ = ["Cadence", "NextTick", "Pacing", "PacingState", "TickOutcome", "TickSummary", "next_delay"]


CONFIRM_SLACK_S = 0.02


@dataclass(frozen=True)
class Pacing:
    poll_interval_s: float = 5.0
    max_backoff_s: float = 15.0  # short enough to catch up soon after slurmctld returns
    max_busy_ticks: int = 5  # ticks run back to back while actions keep happening
    urgent_interval_s: float = 0.5  # while a recovery or a suspect node is in progress


class TickOutcome(Protocol):
    """What pacing reads of a tick's result (the engine's ``TickResult`` has these fields)."""

    @property
    def ok(self) -> bool: ...

    @property
    def acted(self) -> bool: ...

    @property
    def urgent(self) -> bool: ...

    @property
    def retry_in(self) -> float | None: ...

    @property
    def confirm_in(self) -> float | None: ...


@dataclass(frozen=True)
class TickSummary:
    """A tick's outcome as plain data (tests, and loops that do not hold a ``TickResult``)."""

    ok: bool
    acted: bool = False
    urgent: bool = False
    retry_in: float | None = None  # the error's own advice, when the tick failed
    confirm_in: float | None = None  # seconds until a suspect node's probes can confirm its death


class Cadence(StrEnum):
    POLL = "poll"  # nothing going on: the regular poll (the simulator may skip such ticks)
    BUSY = "busy"  # the engine acted: tick again at once
    URGENT = "urgent"  # a recovery is in progress: tick again soon
    BACKOFF = "backoff"  # Slurm did not answer: wait longer each time


@dataclass(frozen=True)
class NextTick:
    delay_s: float
    cadence: Cadence

    @property
    def quiet(self) -> bool:
        """True for the regular poll: nothing the last tick saw asks for an earlier look."""
        return self.cadence is Cadence.POLL


@dataclass(frozen=True)
class PacingState:
    busy_ticks: int  # ticks in a row that acted (kept across failed ticks)
    backoff_s: float  # the last wait after a failed tick; the poll interval after a good one

    @classmethod
    def start(cls, pacing: Pacing) -> PacingState:
        return cls(busy_ticks=0, backoff_s=pacing.poll_interval_s)


def next_delay(pacing: Pacing, state: PacingState, tick: TickOutcome) -> tuple[NextTick, PacingState]:
    """The wait before the next tick after ``tick``, and the state the tick after that starts from."""
    if not tick.ok:
        return _backoff(pacing, state, tick.retry_in)
    busy_ticks = state.busy_ticks + 1 if tick.acted else 0
    after = PacingState(busy_ticks=busy_ticks, backoff_s=pacing.poll_interval_s)
    if 0 < busy_ticks < pacing.max_busy_ticks:
        return NextTick(0.0, Cadence.BUSY), after
    if tick.urgent:
        delay = min(pacing.poll_interval_s, pacing.urgent_interval_s)
        if tick.confirm_in is not None:  # a hair past the window: the probe's clock reads after the wait
            delay = min(delay, tick.confirm_in + CONFIRM_SLACK_S)
        return NextTick(delay, Cadence.URGENT), after
    return NextTick(pacing.poll_interval_s, Cadence.POLL), after


def _backoff(pacing: Pacing, state: PacingState, retry_in: float | None) -> tuple[NextTick, PacingState]:
    backoff_s = min(pacing.max_backoff_s, max(state.backoff_s * 2, retry_in or 0.0))
    return NextTick(backoff_s, Cadence.BACKOFF), PacingState(busy_ticks=state.busy_ticks, backoff_s=backoff_s)
