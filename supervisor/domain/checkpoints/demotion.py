"""Checkpoint fallback: when to pass over a checkpoint that the run's attempts fail to resume from.

Pure, over typed records: the attempts (the last step each one's log showed, what its log showed of
its checkpoint load, its nodes and how it ended), the resume plan each was handed, the checkpoints
on record. A *streak* is the newest attempts in a row that were handed the same checkpoint and
failed on it: ended unsuccessfully soon after starting (or with their log showing the load failed),
not on a node found faulty, without training past the checkpoint (a step beyond it says it loaded).

After ``failures`` attempts in the streak the checkpoint is passed over (demoted) only on evidence
that loading it failed — otherwise the failure is not the checkpoint's:

* **the log shows it**: each of the newest ``failures`` attempts' logs showed a load error, or a
  load that began and was followed by neither a step nor a finished load
  (``AttemptRecord.load_failed``, from ``domain/progress/loads.py``);
* **the failure follows the checkpoint across nodes**: two attempts of the streak ended the same
  way (end state and exit code) on disjoint sets of nodes.

An attempt whose log shows it died of an exception before any load began and before any step
(``AttemptRecord.failed_before_load``: an import error, a bad flag) did not fail on its checkpoint:
it ends the streak, and a crash loop of such attempts never walks a checkpoint back.

Without evidence, a run falls back **at most one checkpoint**: the checkpoint is passed over only
when no other verified checkpoint newer than the one the run would resume from next was passed over
without evidence (so two checkpoints in a row are never passed over without it); otherwise it is
kept, and the answer says why. Whether an earlier demotion had evidence is read again from the
attempts that were handed that checkpoint (the same test), so a daemon restart changes nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from supervisor.domain.records import AttemptRecord


@dataclass(frozen=True)
class LoadFailureRule:
    failures: int = 2  # attempts in a row
    window_s: float = 900.0  # "soon": ended within this long of starting
    attempts_to_read: int = 64  # how far back the evidence behind earlier demotions is looked for


@dataclass(frozen=True)
class Standing:
    """A checkpoint on record, as fallback sees it."""

    location: str
    step: int | None
    verified: bool  # its verification found it whole: the run may resume from it
    passed_over: bool = False  # demoted already


@dataclass(frozen=True)
class Demotion:
    """Pass over ``location``: ``evidence`` says loading it failed (None: the one step back allowed
    without evidence)."""

    location: str
    streak: tuple[str, ...]  # the failed attempts, newest first, as the logbook says them
    evidence: str | None = None

    @property
    def why(self) -> str:
        failed = (
            f"{len(self.streak)} incarnations in a row failed soon after resuming from it: {'; '.join(self.streak)}"
        )
        if self.evidence is not None:
            return f"{failed}; loading it failed: {self.evidence}"
        return f"{failed}; no evidence that loading it failed, the one step back allowed without it"


@dataclass(frozen=True)
class Kept:
    """``location`` is not passed over although attempts keep failing on it: no evidence says loading
    it failed, and ``unbacked`` newer checkpoints were already passed over without evidence."""

    location: str
    streak: tuple[str, ...]
    unbacked: tuple[str, ...]

    @property
    def why(self) -> str:
        return (
            f"{len(self.streak)} incarnations in a row failed on it ({'; '.join(self.streak)}), but nothing shows "
            f"that loading it failed (no load error in the log, no load left unfinished, the same failure not seen "
            f"on other nodes) and {', '.join(self.unbacked)} was already passed over without evidence: the failure "
            "is not taken for the checkpoint's, and the run does not fall back further"
        )


def failed_load_demotion(
    attempts: Sequence[AttemptRecord],
    handed: Mapping[int, str],
    checkpoints: Sequence[Standing],
    faulty: Collection[str],
    rule: LoadFailureRule = LoadFailureRule(),
) -> Demotion | Kept | None:
    """The checkpoint to pass over (or to keep, and why) when the newest attempts keep failing to
    resume from it; None when they do not.

    ``handed``: attempt seq -> the checkpoint location it was handed; ``checkpoints``: those on
    record; ``faulty``: nodes kept out of the run for a fault (an attempt on one failed for that)."""
    steps = {c.location: c.step for c in checkpoints}
    newest_first = sorted(attempts, key=lambda x: x.seq, reverse=True)
    location, streak = _streak(newest_first, handed, steps, faulty, rule)
    if location is None or len(streak) < rule.failures:
        return None
    labels = tuple(_label(a) for a in streak)
    evidence = _evidence(streak, rule)
    if evidence is not None:
        return Demotion(location, labels, evidence)
    unbacked = _unbacked_newer(location, checkpoints, newest_first, handed, faulty, rule)
    if unbacked:
        return Kept(location, labels, unbacked)
    return Demotion(location, labels)


def _streak(
    newest_first: Sequence[AttemptRecord],
    handed: Mapping[int, str],
    steps: Mapping[str, int | None],
    faulty: Collection[str],
    rule: LoadFailureRule,
) -> tuple[str | None, list[AttemptRecord]]:
    """The checkpoint the newest attempts in a row were handed and failed on, and those attempts."""
    streak: list[AttemptRecord] = []
    location = None
    for a in newest_first:
        loc = handed.get(a.seq)
        if loc is None or (location is not None and loc != location) or not _failed_on(a, steps.get(loc), faulty, rule):
            break
        location = loc
        streak.append(a)
    return location, streak


def _failed_on(a: AttemptRecord, step: int | None, faulty: Collection[str], rule: LoadFailureRule) -> bool:
    """The attempt ran and ended unsuccessfully, soon after starting or with its log showing the load
    failed; not on a node found faulty (that explains it), not after training past its checkpoint."""
    if a.started_at is None or a.ended_at is None or a.end_state == "COMPLETED":
        return False
    if set(a.nodes) & set(faulty):
        return False
    if a.last_step is not None and step is not None and a.last_step > step:
        return False  # it trained past the checkpoint: the checkpoint loaded
    if a.failed_before_load is not None and a.load_failed is None:
        return False  # it died of something else before any load began: not the checkpoint's fault
    return a.load_failed is not None or a.ended_at - a.started_at <= rule.window_s


def _evidence(failed: Sequence[AttemptRecord], rule: LoadFailureRule) -> str | None:
    """What says loading failed, over attempts (newest first) that failed on one checkpoint."""
    newest = failed[: rule.failures]
    if len(newest) == rule.failures and all(a.load_failed is not None for a in newest):
        return "; ".join(f"{a.label}: {a.load_failed}" for a in newest)
    for i, a in enumerate(failed):
        for b in failed[i + 1 :]:
            if _same_failure_elsewhere(a, b):
                return (
                    f"the same failure ({a.end_state}, exit code {a.exit_code}) on different nodes: "
                    f"{a.label} on {','.join(a.nodes)}, {b.label} on {','.join(b.nodes)}"
                )
    return None


def _same_failure_elsewhere(a: AttemptRecord, b: AttemptRecord) -> bool:
    return (
        bool(a.nodes)
        and bool(b.nodes)
        and not set(a.nodes) & set(b.nodes)
        and (a.end_state, a.exit_code) == (b.end_state, b.exit_code)
    )


def _unbacked_newer(
    location: str,
    checkpoints: Sequence[Standing],
    newest_first: Sequence[AttemptRecord],
    handed: Mapping[int, str],
    faulty: Collection[str],
    rule: LoadFailureRule,
) -> tuple[str, ...]:
    """The verified checkpoints, other than ``location``, newer than the one the run would resume
    from once ``location`` is passed over, that were passed over without evidence."""
    by_location = {c.location: c for c in checkpoints}
    step = by_location[location].step if location in by_location else None
    if step is None:  # it cannot be placed among the others: any unbacked demotion counts
        floor = None
    else:
        older = [
            c.step for c in checkpoints if c.verified and not c.passed_over and c.step is not None and c.step < step
        ]
        floor = max(older, default=None)
    out = []
    for c in sorted(checkpoints, key=lambda c: c.step or 0, reverse=True):
        if c.location == location or not (c.verified and c.passed_over):
            continue
        if floor is not None and c.step is not None and c.step <= floor:
            continue
        failed = [a for a in newest_first if handed.get(a.seq) == c.location and _failed_on(a, c.step, faulty, rule)]
        if _evidence(failed, rule) is None:
            out.append(c.location)
    return tuple(out)


def _label(a: AttemptRecord) -> str:
    return f"{a.label} ended {a.end_state} after {(a.ended_at or 0) - (a.started_at or 0):.0f} s"
