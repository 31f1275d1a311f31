"""A token bucket shared by the threads of one full verification: a bandwidth limit in bytes/s.

Each reader takes the bytes of the chunk it just received; when the bucket is in debt the reader
waits until the debt is paid. Waits go through an injected ``wait`` (an ``Event.wait`` in
production, so a stop cuts them short; a fake in tests).
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class TokenBucket:
    def __init__(
        self,
        rate_bytes_s: float,
        *,
        burst_bytes: float | None = None,
        monotonic: Callable[[], float],
        wait: Callable[[float], object],
    ) -> None:
        if rate_bytes_s <= 0:
            raise ValueError(f"bandwidth limit must be > 0 bytes/s, not {rate_bytes_s} (leave it unset for no limit)")
        self.rate = float(rate_bytes_s)
        self.burst = float(burst_bytes if burst_bytes is not None else rate_bytes_s / 4)
        self._monotonic = monotonic
        self._wait = wait
        self._lock = threading.Lock()
        self._tokens = self.burst
        self._last = monotonic()

    def take(self, n: int) -> float:
        """Account for ``n`` bytes; wait as long as the limit requires. Returns the seconds waited."""
        with self._lock:
            now = self._monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate) - n
            self._last = now
            delay = -self._tokens / self.rate if self._tokens < 0 else 0.0
        if delay > 0:
            self._wait(delay)
        return delay
