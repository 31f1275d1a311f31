"""The goodput sweep: a run's wall time cut at every boundary and each piece given to one owner.

Run segments (an attempt running) and claims (detection, restart, queue, rework: each a time span
with its cause) overlap; the sweep hands every second to the highest-priority claim covering it,
else to productive (an attempt running) or idle, so that lost time is counted once. Pure arithmetic
over spans; which claims a run has is domain.goodput.account's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

Claim = tuple[float, float, str, str]  # (from, to, kind, cause category)
_PRIORITY = {"detection": 0, "restart": 1, "queue": 2, "rework": 3}  # who owns a second claimed twice


@dataclass(frozen=True)
class Lost:
    rework_s: float = 0.0
    detection_s: float = 0.0
    restart_s: float = 0.0
    queue_s: float = 0.0
    overhead_s: float = 0.0  # running, but no kept step computed: checkpoint saves, slow steps

    @property
    def total_s(self) -> float:
        return self.rework_s + self.detection_s + self.restart_s + self.queue_s + self.overhead_s

    def plus(self, kind: str, s: float) -> Lost:
        return Lost(**{**self.__dict__, f"{kind}_s": getattr(self, f"{kind}_s") + s})


def back_from(t: float, amount: float, segments: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Running time of ``amount`` seconds ending at ``t``, walking back over the run segments."""
    out = []
    for a, b in sorted(segments, reverse=True):
        if amount <= 0:
            break
        top = min(b, t)
        if top <= a:
            continue
        take = min(amount, top - a)
        out.append((top - take, top))
        amount -= take
    return out


def sweep(
    lo: float, hi: float, segments: Sequence[tuple[float, float]], claims: Sequence[Claim]
) -> tuple[float, float, float, Lost, dict[str, Lost]]:
    """Walk [lo, hi] boundary to boundary; each piece goes to the highest-priority claim, else to
    productive (an attempt running) or idle."""
    tally = _Tally()
    running = 0
    active: dict[tuple[str, str], int] = {}
    prev = lo
    for x, delta, label in _boundaries(segments, claims):
        piece = min(x, hi) - max(prev, lo) if x > prev and prev < hi else 0.0
        if piece > 0:
            top = min(active, key=lambda k: (_PRIORITY[k[0]], k[1])) if active else None
            tally.add(piece, bool(running), top)
        prev = max(prev, x)
        if label is None:
            running += delta
        else:
            active[label] = active.get(label, 0) + delta
            if active[label] <= 0:
                del active[label]
    if prev < hi:
        tally.idle += hi - max(prev, lo)
    return tally.productive, tally.run_s, tally.idle, tally.lost, dict(sorted(tally.by_cause.items()))


def _boundaries(
    segments: Sequence[tuple[float, float]], claims: Sequence[Claim]
) -> list[tuple[float, int, tuple[str, str] | None]]:
    """Where each run segment (label None) and each claim (its kind and cause) begins (+1) and ends (-1)."""
    points: list[tuple[float, int, tuple[str, str] | None]] = []
    for a, b in segments:
        points += [(a, 1, None), (b, -1, None)]
    for a, b, kind, cat in claims:
        points += [(a, 1, (kind, cat)), (b, -1, (kind, cat))]
    points.sort(key=lambda p: p[0])
    return points


@dataclass
class _Tally:
    productive: float = 0.0
    run_s: float = 0.0
    idle: float = 0.0
    lost: Lost = field(default_factory=Lost)
    by_cause: dict[str, Lost] = field(default_factory=dict)

    def add(self, piece: float, running: bool, claim: tuple[str, str] | None) -> None:
        """A piece of time: lost to the claim (kind, cause) owning it, else productive or idle."""
        if running:
            self.run_s += piece
        if claim is not None:
            self.lost = self.lost.plus(claim[0], piece)
            self.by_cause[claim[1]] = self.by_cause.get(claim[1], Lost()).plus(claim[0], piece)
        elif running:
            self.productive += piece
        else:
            self.idle += piece
