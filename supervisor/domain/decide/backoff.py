"""Restart pacing: a run whose attempts keep dying soon after they start is restarted later and
later, and a crash loop pauses it and pages, instead of burning the restart budget in seconds.

Pure. The streak is read from the run's newest attempts (typed records): each attempt that ended
within ``fast_failure_s`` of starting (or never started) extends it; one that ran longer — a
healthy stretch — ends it. The delay doubles with each fast failure in the streak, from ``base_s``
up to ``max_s``, spread by a jitter that is a pure function of the run and the attempt (the same
after a daemon restart; runs that failed together do not come back together). From
``crash_loop_after`` fast failures on, the run waits ``crash_loop_pause_s`` before each restart,
and the first pause pages.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from supervisor.domain.records import AttemptRecord
from supervisor.domain.run import RestartPacing

__all__ = ["Backoff", "RestartPacing", "fast_failures", "restart_backoff"]


@dataclass(frozen=True)
class Backoff:
    """Wait before the next restart: until ``until``, for ``fast_failures`` in a row."""

    delay_s: float
    until: float
    fast_failures: int
    crash_loop: bool
    streak: tuple[str, ...]  # the attempts that failed fast, newest first, as the logbook says them

    @property
    def why(self) -> str:
        what = "crash loop" if self.crash_loop else "fast failures"
        return (
            f"{what}: {self.fast_failures} attempt(s) in a row ended soon after starting ({'; '.join(self.streak[:3])})"
        )


def restart_backoff(
    run: str, attempts: Sequence[AttemptRecord], pacing: RestartPacing, faulty: Collection[str] = ()
) -> Backoff | None:
    """How long to wait before restarting ``run`` after its newest attempt; None: restart now.
    ``faulty``: nodes the run keeps out for a fault — an attempt that ran on one failed for that
    (and the restart avoids it): it does not count."""
    streak = fast_failures(attempts, pacing.fast_failure_s, faulty)
    if not streak:
        return None
    newest = max(attempts, key=lambda a: a.seq)
    ended = newest.ended_at if newest.ended_at is not None else newest.submitted_at
    n = len(streak)
    if n >= pacing.crash_loop_after:
        delay = pacing.crash_loop_pause_s
    else:
        delay = min(pacing.max_s, pacing.base_s * 2.0 ** (n - 1)) * _spread(run, newest.seq, pacing.jitter)
    return Backoff(delay, ended + delay, n, n >= pacing.crash_loop_after, tuple(streak))


def fast_failures(attempts: Sequence[AttemptRecord], fast_failure_s: float, faulty: Collection[str] = ()) -> list[str]:
    """The newest attempts, newest first, that ended unsuccessfully within ``fast_failure_s`` of
    starting (or ended without starting); stops at the first that ran longer, succeeded, or ran
    on a node kept out for a fault."""
    out = []
    for a in sorted(attempts, key=lambda x: x.seq, reverse=True):
        if a.ended_at is None or a.end_state == "COMPLETED" or set(a.nodes) & set(faulty):
            break
        ran = a.ended_at - a.started_at if a.started_at is not None else 0.0
        if ran > fast_failure_s:
            break
        out.append(f"{a.label} ended {a.end_state} after {ran:.0f} s")
    return out


def _spread(run: str, seq: int, jitter: float) -> float:
    """A factor in [1 - jitter, 1 + jitter], fixed for the run and attempt."""
    u = zlib.crc32(f"{run}:{seq}".encode()) / 0xFFFFFFFF
    return 1.0 + jitter * (2.0 * u - 1.0)
