"""A virtual clock that is also the simulator's event queue.

Everything simulated (node timeouts, job ends, injected faults, a synthetic trainer) registers
callbacks with ``call_at``/``call_later``; advancing the clock runs the callbacks that fall due, in
time order (ties in registration order), with ``now()`` set to each callback's own time. Time jumps
straight from one event to the next, so weeks of simulated time cost only as much as the events in
them.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

#: 2026-11-29T00:00:00Z, the default start of simulated time.
DEFAULT_START = 1795910400.0


class Timer:
    """A scheduled callback. ``cancel()`` makes it a no-op (it is dropped lazily)."""

    __slots__ = ("when", "_fn", "_args", "cancelled", "background")

    def __init__(self, when: float, fn: Callable[..., Any], args: tuple[Any, ...], background: bool = False) -> None:
        self.when = when
        self._fn = fn
        self._args = args
        self.cancelled = False
        self.background = background  # housekeeping nobody needs to look at when it happens

    def cancel(self) -> None:
        self.cancelled = True

    def fire(self) -> None:
        self._fn(*self._args)


class VirtualClock:
    """Implements the ``Clock`` port on virtual time.

    ``wait(seconds)`` advances virtual time by ``seconds`` (running due events) and returns False,
    or True when ``stop()`` was called (before the wait, or by an event during it: the wait then
    ends at that event's time, like a real wait woken early).
    """

    def __init__(self, start: float = DEFAULT_START) -> None:
        self._now = float(start)
        self._queue: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._stopped = False
        self._running = False
        self._listeners: list[Callable[[float], None]] = []

    # -- Clock port ---------------------------------------------------------------------------

    def now(self) -> float:
        return self._now

    def wait(self, seconds: float) -> bool:
        if self._stopped:
            return True
        self._run_until(self._now + max(0.0, float(seconds)), interruptible=True)
        return self._stopped

    # -- driving time -------------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, running every event that falls due (stop ignored)."""
        if seconds < 0:
            raise ValueError(f"cannot advance by a negative duration: {seconds}")
        self._run_until(self._now + float(seconds), interruptible=False)

    def advance_to(self, when: float) -> None:
        """Move time forward to ``when`` (absolute), running due events."""
        if when < self._now:
            raise ValueError(f"cannot go back in time: {when} < {self._now}")
        self._run_until(float(when), interruptible=False)

    def run_next(self) -> bool:
        """Jump to the next pending event and run everything due then; False when none is left."""
        nxt = self.next_event_time()
        if nxt is None:
            return False
        self.advance_to(max(nxt, self._now))
        return True

    def stop(self) -> None:
        """Make the current and every later ``wait`` return True at once."""
        self._stopped = True

    def clear_stop(self) -> None:
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    # -- events -------------------------------------------------------------------------------

    def call_at(self, when: float, fn: Callable[..., Any], *args: Any) -> Timer:
        """Run ``fn(*args)`` at virtual time ``when`` (a past time runs at the next advance)."""
        timer = Timer(max(float(when), self._now), fn, args)
        heapq.heappush(self._queue, (timer.when, next(self._seq), timer))
        return timer

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> Timer:
        return self.call_at(self._now + max(0.0, float(delay)), fn, *args)

    def call_background(self, when: float, fn: Callable[..., Any], *args: Any) -> Timer:
        """Like ``call_at``, for housekeeping (e.g. purging a finished job's record) that a driver
        skipping quiet time need not stop for: see ``next_event_time(foreground_only=True)``."""
        timer = Timer(max(float(when), self._now), fn, args, background=True)
        heapq.heappush(self._queue, (timer.when, next(self._seq), timer))
        return timer

    def next_event_time(self, *, foreground_only: bool = False) -> float | None:
        while self._queue and self._queue[0][2].cancelled:
            heapq.heappop(self._queue)
        if not foreground_only or not self._queue or not self._queue[0][2].background:
            return self._queue[0][0] if self._queue else None
        return min((when for when, _, t in self._queue if not t.cancelled and not t.background), default=None)

    def pending_events(self) -> int:
        return sum(1 for _, _, timer in self._queue if not timer.cancelled)

    def add_listener(self, fn: Callable[[float], None]) -> None:
        """Call ``fn(now)`` after every advance (for displays; events should use ``call_at``)."""
        self._listeners.append(fn)

    # -- internals ----------------------------------------------------------------------------

    def _run_until(self, target: float, *, interruptible: bool) -> None:
        if self._running:
            raise RuntimeError("an event callback must not advance the clock")
        self._running = True
        try:
            interrupted = self._drain(target, interruptible)
            if not interrupted:
                self._now = max(self._now, target)
        finally:
            self._running = False
        for listener in list(self._listeners):
            listener(self._now)

    def _drain(self, target: float, interruptible: bool) -> bool:
        """Run due events up to ``target``; True when a ``stop()`` interrupted the wait."""
        queue = self._queue
        while queue and queue[0][0] <= target:
            when, _, timer = heapq.heappop(queue)
            if timer.cancelled:
                continue
            self._now = max(self._now, when)
            timer.fire()
            if interruptible and self._stopped:
                return True
        return False
