"""How often one UID may make the guard ask Slurm (review 2026-12-02, finding 4: every DOWN or
DRAIN line had the SlurmUser read the whole job table, and nothing bounded how often).

A token bucket per UID: ``burst`` requests at once (an honest instance asks about every faulty
node of an incident in one tick), then ``rate_per_s``. Admins are not limited. At most
``MAX_UIDS`` buckets are kept (the least recently used is forgotten: a full bucket again)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

MAX_UIDS = 4096


@dataclass
class _Bucket:
    tokens: float
    at: float


class RateLimit:
    def __init__(self, *, rate_per_s: float = 1.0, burst: float = 40.0) -> None:
        self.rate_per_s, self.burst = rate_per_s, burst
        self._buckets: OrderedDict[int, _Bucket] = OrderedDict()

    def allow(self, uid: int, now: float) -> bool:
        bucket = self._buckets.pop(uid, None) or _Bucket(self.burst, now)
        bucket.tokens = min(self.burst, bucket.tokens + max(0.0, now - bucket.at) * self.rate_per_s)
        bucket.at = now
        self._buckets[uid] = bucket
        while len(self._buckets) > MAX_UIDS:
            self._buckets.popitem(last=False)
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True

    def next_at(self, uid: int) -> float:
        """When ``uid`` may ask again (seconds since the epoch, as ``now``)."""
        bucket = self._buckets.get(uid)
        return 0.0 if bucket is None else bucket.at + max(0.0, 1.0 - bucket.tokens) / self.rate_per_s
