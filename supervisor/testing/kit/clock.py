"""A clock for tests that moves only when told: the ``Clock`` port without the simulator's queue.

``sim.clock.VirtualClock`` is the simulator's clock (it runs scheduled events as time passes);
this one is for a test that holds a part of the daemon and says what time it is.
"""

from __future__ import annotations

from collections.abc import Callable

START = 1000.0  # the tests' usual "now": far from 0, so "since 0" and "never" stay apart

WaitHook = Callable[[float], bool]  # (seconds asked) -> True to end the wait as woken to stop


class ManualClock:
    """Implements ``ports.Clock``. ``wait(seconds)`` moves time on by ``seconds`` and returns
    False; ``on_wait`` (optional) runs first and may end the wait as a stop does (True). Every
    wait asked for is kept in ``waits``, so a test can assert how long a loop meant to sleep."""

    def __init__(self, start: float = START, *, on_wait: WaitHook | None = None) -> None:
        self._now = float(start)
        self._on_wait = on_wait
        self._stopped = False
        self.waits: list[float] = []

    def now(self) -> float:
        return self._now

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        if self._on_wait is not None and self._on_wait(seconds):
            self._stopped = True
        if self._stopped:
            return True
        self._now += max(0.0, seconds)
        return False

    def advance(self, seconds: float) -> float:
        """Move time on by ``seconds``; returns the new now."""
        self._now += seconds
        return self._now

    def move_to(self, at: float) -> None:
        """Set the time (backwards too: a test of a clock that steps back)."""
        self._now = float(at)

    def stop(self) -> None:
        """Every wait from now on returns True at once, as the daemon's stop signal makes it."""
        self._stopped = True
