"""``SimCheckpointStore``: the ``CheckpointStore`` port over the synthetic trainer's saves.

A save starts at one virtual time and commits (its manifest written last) ``save_s`` later. When
the attempt dies in between, the save stays torn: its shards are there, its commit marker is not
(``committed=False``); verifying it finds the manifest missing, so it is CORRUPT at either level —
the storage answered, and what it holds is not a checkpoint. A save the trainer generated ahead
of the clock is not visible before its virtual time.
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.domain.checkpoints.manifest import (
    MANIFEST_NAME,
    CheckpointRef,
    Guarantee,
    Level,
    Manifest,
    Outcome,
    ShardProblem,
    VerifyResult,
)
from supervisor.ports import PermanentError
from supervisor.sim.clock import VirtualClock


@dataclass
class SimSave:
    step: int
    started_at: float
    committed_at: float | None  # None: torn (the attempt ended before the manifest was written)
    bad: bool = False  # a baseline restart found it unloadable and fell back

    def committed(self, now: float) -> bool:
        return self.committed_at is not None and self.committed_at <= now


class SimCheckpointStore:
    def __init__(
        self, clock: VirtualClock, root: str = "sim://checkpoints/run/", shard_bytes: int = 1 << 30, shards: int = 8
    ) -> None:
        self.clock = clock
        self.root = root
        self.shard_bytes = shard_bytes
        self.shards = shards
        self._saves: dict[int, SimSave] = {}
        # A 54-day run holds thousands of saves and the engine lists them all every scan: the
        # listing is kept. Its first ``_settled`` refs are of saves begun and committed (or torn)
        # by the last listing, which time alone cannot change; only a save begun again, torn or
        # committed by hand does (``_changed``: list again from scratch).
        self._listing: list[CheckpointRef] = []
        self._settled = 0
        self._changed = False
        self._top = -1  # the highest step begun
        self._refs: dict[int, CheckpointRef] = {}  # each save's ref, made again only when it changes

    # -- the trainer's side ---------------------------------------------------------------------

    def begin_save(self, step: int, at: float, commit_at: float) -> None:
        self._changed |= step <= self._top  # begun again, or among older ones: not at the listing's end
        self._top = max(self._top, step)
        self._saves[step] = SimSave(step, at, commit_at)

    def attempt_ended(self, at: float) -> None:
        """The writer died at ``at``: saves begun later never happened, unfinished ones are torn."""
        for step in reversed(list(self._saves)[-8:]):  # saves are made in order: only the newest can be affected
            save = self._saves[step]
            if save.started_at > at:
                del self._saves[step]
                self._changed = True
            elif save.committed_at is not None and save.committed_at > at:
                save.committed_at = None
                self._changed = True

    def visible(self) -> list[SimSave]:
        now = self.clock.now()
        saves = self._saves
        return [save for save in map(saves.__getitem__, sorted(saves)) if save.started_at <= now]

    def newest(self, *, committed_only: bool) -> SimSave | None:
        now = self.clock.now()
        for save in reversed(self.visible()):
            if save.bad:
                continue
            if save.committed(now) or not committed_only:
                return save
        return None

    def get(self, step: int) -> SimSave | None:
        save = self._saves.get(step)
        return save if save is not None and save.started_at <= self.clock.now() else None

    def location(self, step: int) -> str:
        return f"{self.root}step_{step:08d}/"

    # -- the CheckpointStore port ---------------------------------------------------------------

    def discover(self) -> list[CheckpointRef]:
        now = self.clock.now()
        if self._changed:
            self._listing, self._settled, self._changed = [], 0, False
        listing = self._listing[: self._settled]
        settling = True  # every save so far is listed for good
        for step in sorted(self._saves)[self._settled :]:
            save = self._saves[step]
            if save.started_at > now:
                settling = False
                continue
            listing.append(self._ref(save, save.committed(now)))
            settling = settling and (save.committed_at is None or save.committed_at <= now)
            self._settled += settling
        self._listing = listing
        return list(listing)

    def _ref(self, save: SimSave, committed: bool) -> CheckpointRef:
        seen_at = save.committed_at or save.started_at
        ref = self._refs.get(save.step)
        if ref is None or ref.committed != committed or ref.seen_at != seen_at:
            ref = self._refs[save.step] = CheckpointRef(
                self.location(save.step),
                f"step_{save.step:08d}",
                save.step,
                Guarantee.MANIFEST,
                committed=committed,
                seen_at=seen_at,
            )
        return ref

    def verify(self, ref: CheckpointRef, level: Level) -> VerifyResult:
        now = self.clock.now()
        save = self.get(ref.step) if ref.step is not None else None
        size = self.shard_bytes * self.shards
        if save is None:
            problem = ShardProblem(MANIFEST_NAME, "missing", "no such checkpoint under the root")
            return VerifyResult(
                ref.location, ref.step, level, Outcome.CORRUPT, "checkpoint not found", problems=(problem,), at=now
            )
        if not save.committed(now):
            problem = ShardProblem(MANIFEST_NAME, "uncommitted", "shards present, no manifest: the save was torn")
            return VerifyResult(
                ref.location,
                save.step,
                level,
                Outcome.CORRUPT,
                "torn: no commit marker",
                problems=(problem,),
                shards=self.shards,
                at=now,
            )
        return VerifyResult(
            ref.location,
            save.step,
            level,
            Outcome.VERIFIED,
            "checkpoint matches its manifest",
            shards=self.shards,
            bytes=size if level is Level.FULL else 0,
            at=now,
        )

    def commit(self, name: str, manifest: Manifest) -> str:
        save = self.get(manifest.step)
        if save is None:
            raise PermanentError(f"{self.root}{name}: no shards for step {manifest.step}")
        if save.committed(self.clock.now()):
            raise PermanentError(f"{self.root}{name}: already committed; refusing to overwrite its manifest")
        save.committed_at = self.clock.now()
        self._changed = True
        return self.location(manifest.step)
