"""The save check at a job's end: the newest verified checkpoint of each run whose job just ended,
and the newer save that storage would not let be checked. Split from ``checkpoints``.

A planned end (domain.decide.continuation) is judged on the save made just before it, so the
committed checkpoints not verified yet are checked in the tick that sees the end (``refresh``). A
save that is committed but unverifiable (a 503, a timeout), or a root that cannot be listed, is not
a missing save: it is reported as ``unchecked`` and the decision waits on it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from supervisor.domain.checkpoints.manifest import CheckpointRef, Outcome, VerifyResult, effective_result
from supervisor.domain.observation import SavedCheckpoint, UncheckedSave
from supervisor.domain.records import RunRecord
from supervisor.ports import Store

RECENT = 64  # checkpoints looked at (the newest verified and its fallbacks are among them)

Rows = list[tuple[CheckpointRef, VerifyResult | None, VerifyResult | None, str | None]]
Refresh = Callable[[RunRecord, Store], str | None]  # lists and verifies now; the listing's error, if any


@dataclass(frozen=True)
class SaveChecks:
    """Per run whose job just ended: its newest verified checkpoint, and a newer unchecked save."""

    saved: dict[str, SavedCheckpoint] = field(default_factory=dict)
    unchecked: dict[str, UncheckedSave] = field(default_factory=dict)


def saves_at_end(runs: Iterable[RunRecord], store: Store, refresh: Refresh) -> SaveChecks:
    checks = SaveChecks()
    for run in runs:
        if run.spec.checkpoints is None or run.state.terminal:
            continue
        listing_error = refresh(run, store)
        rows = store.checkpoints(run.name, RECENT)
        newest = newest_verified(rows)
        if newest is not None:
            checks.saved[run.name] = SavedCheckpoint(newest.location, newest.step, newest.seen_at)
        unchecked = _unchecked(rows, newest, listing_error)
        if unchecked is not None:
            checks.unchecked[run.name] = unchecked
    return checks


def _unchecked(rows: Rows, newest: CheckpointRef | None, listing_error: str | None) -> UncheckedSave | None:
    """The newest committed save past ``newest`` whose check storage would not let finish; else,
    when the root could not be listed, that (a save may be there unseen)."""
    for ref, meta, full, demoted in rows:
        if newest is not None and (ref.step or 0) <= (newest.step or 0):
            break
        eff = effective_result(meta, full)
        if ref.committed and not demoted and (eff is None or eff.outcome is Outcome.UNVERIFIABLE):
            reason = eff.reason if eff is not None else "not checked yet"
            return UncheckedSave(reason, ref.step, ref.location)
    if listing_error is not None:
        return UncheckedSave(f"the checkpoint root cannot be listed: {listing_error}")
    return None


def newest_verified(rows: Rows) -> CheckpointRef | None:
    for ref, meta, full, demoted in rows:
        eff = effective_result(meta, full)
        if eff is not None and eff.outcome is Outcome.VERIFIED and not demoted:
            return ref
    return None
