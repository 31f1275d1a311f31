"""Connection slots shared by the local users of a socket, so that no one of them can take them all
(review 2026-12-02, findings 3 and 6: 16 slots, no per-UID limit, and any local user held every one).

A UID holds at most ``per_uid`` slots at once (root is not limited: it can stop the service
anyway), and the last ``kept`` slots are only for callers the service trusts (the guard: root,
its admins and the instance accounts it is told of; an instance's API: root, its account and its
group). So a stranger with one account holds ``per_uid`` slots, strangers with many accounts hold
``total - kept`` at most, and the trusted still get in. The local API uses it too (``api/server.py``).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class SlotLimits:
    total: int = 16
    per_uid: int = 4
    kept: int = 4  # of ``total``, for trusted callers only

    def __post_init__(self) -> None:
        if not 0 <= self.kept < self.total or self.per_uid < 1:
            raise ValueError(f"slot limits: 0 <= kept < total and per_uid >= 1 ({self})")


class Slots:
    """Thread-safe: taken by the accepting thread, given back by the thread that served."""

    def __init__(self, limits: SlotLimits = SlotLimits()) -> None:
        self.limits = limits
        self._held: Counter[int] = Counter()
        self._lock = threading.Lock()

    def take(self, uid: int, *, trusted: bool) -> bool:
        """A slot for ``uid``, or False (the caller is told "busy")."""
        with self._lock:
            in_use = sum(self._held.values())
            if in_use >= self.limits.total:
                return False
            if uid != 0 and self._held[uid] >= self.limits.per_uid:
                return False
            if not trusted and in_use >= self.limits.total - self.limits.kept:
                return False
            self._held[uid] += 1
            return True

    def give(self, uid: int) -> None:
        with self._lock:
            self._held[uid] -= 1
            if self._held[uid] <= 0:
                del self._held[uid]

    def in_use(self) -> int:
        with self._lock:
            return sum(self._held.values())
