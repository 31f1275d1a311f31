"""A run's progress series as the daemon read it: one point per training-log record with a step.

Kept for two readers: the HTML page draws the loss and throughput curves from it, and goodput reads
each attempt's first and last step (when it began training after its resume, how far it got) and the
run's pace from it. Bounded per run: :func:`decimate` thins a series to ``limit`` points, keeping
each attempt's first and last point (goodput's evidence) and, per bucket of the rest, the points of
lowest and highest loss (a spike stays visible). Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from supervisor.domain.progress.record import ProgressRecord

MAX_POINTS = 2000  # per run, after decimation


@dataclass(frozen=True)
class ProgressPoint:
    """One record with a step, at the time the daemon read it."""

    run: str
    attempt: int  # the attempt's seq
    step: int
    at: float  # when the daemon read the line (its poll's resolution)
    loss: float | None = None
    step_time_s: float | None = None  # seconds per step, as the log printed it
    tokens_per_s: float | None = None
    samples_per_s: float | None = None

    @property
    def throughput(self) -> float | None:
        """Tokens per second where the log says, else samples per second (None: neither)."""
        return self.tokens_per_s if self.tokens_per_s is not None else self.samples_per_s


def finite(v: float | None) -> float | None:
    """``v`` when it is a finite number, else None (a NaN loss is not a point on a curve)."""
    return v if v is not None and math.isfinite(v) else None


def decimate(points: Sequence[ProgressPoint], limit: int = MAX_POINTS) -> list[ProgressPoint]:
    """At most ``limit`` points (``limit`` >= 2 per attempt), in order: every attempt's first and
    last point, and per bucket of the others the lowest and the highest loss."""
    ordered = sorted(points, key=lambda p: (p.attempt, p.step, p.at))
    if len(ordered) <= limit:
        return ordered
    ends = _attempt_ends(ordered)
    rest = [p for i, p in enumerate(ordered) if i not in ends]
    room = max(0, limit - len(ends))
    kept = set(ends)
    picks = _extremes(rest, room // 2) if room >= 2 else []
    index = {id(p): i for i, p in enumerate(ordered)}
    kept.update(index[id(p)] for p in picks)
    return [ordered[i] for i in sorted(kept)]


def _attempt_ends(ordered: Sequence[ProgressPoint]) -> set[int]:
    """Indexes of each attempt's first and last point."""
    ends: set[int] = set()
    for i, p in enumerate(ordered):
        if i == 0 or ordered[i - 1].attempt != p.attempt:
            ends.add(i)
        if i == len(ordered) - 1 or ordered[i + 1].attempt != p.attempt:
            ends.add(i)
    return ends


def _extremes(points: Sequence[ProgressPoint], buckets: int) -> list[ProgressPoint]:
    """The lowest- and highest-loss point of each of ``buckets`` equal slices (one of each)."""
    if buckets <= 0 or not points:
        return []
    out: list[ProgressPoint] = []
    size = len(points) / buckets
    for b in range(buckets):
        chunk = points[int(b * size) : int((b + 1) * size)]
        if not chunk:
            continue
        ranked = sorted(chunk, key=lambda p: (p.loss is None, p.loss if p.loss is not None else 0.0))
        out.append(ranked[0])
        if len(chunk) > 1:
            out.append(max(chunk, key=lambda p: p.loss if p.loss is not None else -math.inf))
    return out


def point_of(run: str, seq: int, record: ProgressRecord, now: float) -> ProgressPoint:
    """The series' point for a record with a step (one per log record: per-rank lines are not)."""
    assert record.step is not None
    return ProgressPoint(
        run,
        seq,
        record.step,
        now,
        finite(record.loss),
        finite(record.step_time_s),
        finite(record.tokens_per_s),
        finite(record.samples_per_s) or _samples_per_s(record),
    )


def _samples_per_s(record: ProgressRecord) -> float | None:
    """Samples per second from the global batch and the step time, where the log prints no rate."""
    batch, step_s = record.global_batch_size, finite(record.step_time_s)
    return batch / step_s if batch and step_s else None
