"""Checkpoint fallback: when to pass over a checkpoint that the run's attempts fail to resume from.

Pure, over typed records: the attempts (with the last step each one's log showed), the resume plan
each was handed, the checkpoints' steps. A checkpoint is passed over (demoted) after
``failures`` attempts in a row that were handed it ended unsuccessfully soon after starting,
without a node fault to explain it and without training past it (an attempt that logged a step
beyond the checkpoint loaded it).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from supervisor.domain.records import AttemptRecord


@dataclass(frozen=True)
class LoadFailureRule:
    failures: int = 2  # attempts in a row
    window_s: float = 900.0  # "soon": ended within this long of starting

    @property
    def attempts_to_read(self) -> int:
        return 2 * self.failures + 2


@dataclass(frozen=True)
class Demotion:
    location: str
    streak: tuple[str, ...]  # the failed attempts, newest first, as the logbook says them

    @property
    def why(self) -> str:
        return f"{len(self.streak)} incarnations in a row failed soon after resuming from it: {'; '.join(self.streak)}"


def failed_load_demotion(
    attempts: Sequence[AttemptRecord],
    handed: Mapping[int, str],
    steps: Mapping[str, int | None],
    faulty: Collection[str],
    rule: LoadFailureRule = LoadFailureRule(),
) -> Demotion | None:
    """The checkpoint to pass over, if the newest attempts keep failing to resume from it.

    ``handed``: attempt seq -> the checkpoint location it was handed; ``steps``: location -> its
    step; ``faulty``: nodes kept out of the run for a fault (an attempt on one failed for that)."""
    streak: list[str] = []
    location = None
    for a in sorted(attempts, key=lambda x: x.seq, reverse=True):
        loc = handed.get(a.seq)
        if loc is None or (location is not None and loc != location) or not _failed_soon(a, faulty, rule):
            break
        step = steps.get(loc)
        if a.last_step is not None and step is not None and a.last_step > step:
            break  # it trained past the checkpoint: the checkpoint loaded
        location = loc
        streak.append(f"{a.label} ended {a.end_state} after {(a.ended_at or 0) - (a.started_at or 0):.0f} s")
    if location is None or len(streak) < rule.failures:
        return None
    return Demotion(location, tuple(streak))


def _failed_soon(a: AttemptRecord, faulty: Collection[str], rule: LoadFailureRule) -> bool:
    """The attempt ran, ended unsuccessfully within the window, and not on a node found faulty."""
    if a.started_at is None or a.ended_at is None or a.end_state == "COMPLETED":
        return False
    if set(a.nodes) & set(faulty):
        return False  # a node fault explains it, not the checkpoint
    return a.ended_at - a.started_at <= rule.window_s
