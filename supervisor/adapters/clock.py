"""The real clock: wall time, and waits that a signal handler can cut short."""

from __future__ import annotations

import threading
import time


class SystemClock:
    def __init__(self) -> None:
        self._stop = threading.Event()

    def now(self) -> float:
        return time.time()

    def wait(self, seconds: float) -> bool:
        return self._stop.wait(max(0.0, seconds))

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()
