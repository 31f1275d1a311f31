"""The daemon's clock, whose wait another thread may cut short: a hint that the next tick should
come now (a launcher reported its step dead, docs/in-allocation.md).

The wake is only a hint — crash-only: the tick decides from the store and Slurm as always, and a
wake lost (one that came while a tick ran: the next wait is cut short anyway) costs one poll at
most. A stop still ends the wait at once and every wait after it.
"""

from __future__ import annotations

import threading

from supervisor.adapters.clock import SystemClock


class WakeableClock(SystemClock):
    def __init__(self) -> None:
        super().__init__()
        self._woken = threading.Event()

    def wake(self) -> None:
        """Cut the current (or next) wait short. Thread-safe."""
        self._woken.set()

    def stop(self) -> None:
        super().stop()
        self._woken.set()

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds``, less when woken; True when the daemon must stop."""
        if self.stopped:
            return True
        self._woken.wait(max(0.0, seconds))
        self._woken.clear()  # a stop that raced this clear is still seen below: stopped is set first
        return self.stopped
