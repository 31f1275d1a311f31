"""Checkpoint verification over any ObjectBackend (S3, POSIX): three outcomes, never a guess.

* **metadata**: read the manifest, list the checkpoint's prefix once (paginated), HEAD the shards
  whose stored checksum the listing does not give (in parallel; when a first batch of HEADs shows
  that the storage keeps neither a checksum of the manifest's algorithm nor object versions, as
  Ceph 16 or uploads without ``ChecksumAlgorithm``, the rest are skipped), and compare with the manifest
  (``check_listing``): presence, size, stored checksum where the storage keeps one, object version,
  a manifest whose step is not the checkpoint's (stale).
* **full**: the same listing checks, then every shard streamed once (one GET per shard, shards in
  parallel, memory bounded by ``workers x chunk_size``) through ``Digest`` and compared with the
  manifest (``check_digests``). Optionally under a bandwidth limit (a token bucket shared by the
  readers) so that it can run in the background beside training.

Outcomes: VERIFIED; CORRUPT when the storage answered and what it holds does not match (which
shard, why); UNVERIFIABLE for every storage error, timeout or deadline — never CORRUPT. Definite
evidence wins: a missing shard found before a timeout elsewhere still makes the checkpoint CORRUPT.

A checkpoint without its commit marker (``committed=False``) is never VERIFIED. While its newest
object is younger than ``uncommitted_grace_s`` it may be an upload in progress: UNVERIFIABLE,
"commit marker not written yet". Older than that it is a torn upload: CORRUPT, problem
"uncommitted". (A restart never resumes from either; the difference is what the logbook says and
whether the supervisor keeps looking at it.)

Adopted layouts (DCP, Megatron, NeMo) have no checksums: metadata runs the layout's presence checks
(``check_adopted``); full also reads every byte of every object and compares the count with the
listing. The result carries the weaker ``guarantee``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from supervisor.adapters.checkpoints.backend import ObjectBackend, StorageError
from supervisor.adapters.checkpoints.reads import ParallelReads, Stopped, VerifyRun
from supervisor.domain.checkpoints.adopted import check_adopted
from supervisor.domain.checkpoints.checks import check_digests, check_listing, summarize
from supervisor.domain.checkpoints.manifest import (
    MANIFEST_NAME,
    CheckpointRef,
    ChecksumAlgorithm,
    Guarantee,
    Level,
    Manifest,
    ManifestError,
    ObjectInfo,
    Outcome,
    ShardProblem,
    VerifyResult,
    manifest_origin,
)
from supervisor.domain.checkpoints.origin import UNVOUCHED, adopted_problems, ownership_problems, signature_problems
from supervisor.domain.checkpoints.signing import Origin
from supervisor.domain.run import Trust
from supervisor.ports import Clock

log = structlog.get_logger(__name__)

DEFAULT_GRACE_S = 2 * 3600.0  # an upload of a large checkpoint can take tens of minutes


@dataclass(frozen=True)
class _Found:
    outcome: Outcome
    reason: str
    problems: tuple[ShardProblem, ...] = ()
    shards: int = 0
    bytes: int = 0


def relative_prefix(backend: ObjectBackend, location: str) -> str:
    """The key prefix of a checkpoint at ``location`` relative to the backend's root, with a
    trailing "/" ("" for the root itself). ValueError when it is not under the root."""
    base = backend.location("").rstrip("/")
    loc = location.rstrip("/")
    if loc == base:
        return ""
    if not loc.startswith(base + "/"):
        raise ValueError(f"checkpoint {location} is not under the store's root {backend.root}")
    return loc[len(base) + 1 :] + "/"


class Verifier:
    """Verifies checkpoints of one backend. Thread-safe; one verification at a time per call."""

    def __init__(
        self,
        backend: ObjectBackend,
        *,
        clock: Clock,
        workers: int = 8,
        chunk_size: int = 4 << 20,
        bandwidth_bytes_s: float | None = None,
        deadline_s: float | None = 6 * 3600.0,
        uncommitted_grace_s: float = DEFAULT_GRACE_S,
        read_attempts: int = 2,
        monotonic: Callable[[], float] = time.monotonic,
        key: bytes | None = None,
        trust: Trust = Trust.OWNER,
        uid: int | None = None,
    ) -> None:
        if workers < 1 or chunk_size < 1 or read_attempts < 1:
            raise ValueError("verification workers, chunk_size and read_attempts must be >= 1")
        if deadline_s is not None and deadline_s <= 0:
            raise ValueError(f"verification deadline_s must be > 0 seconds or unset, not {deadline_s}")
        if bandwidth_bytes_s is not None and bandwidth_bytes_s <= 0:
            raise ValueError(f"bandwidth_bytes_s must be > 0 or unset, not {bandwidth_bytes_s}")
        self.backend = backend
        self.clock = clock
        self.workers = workers
        self.deadline_s = deadline_s
        self.uncommitted_grace_s = uncommitted_grace_s
        self.monotonic = monotonic
        self.key = key  # the run's manifest key (domain.checkpoints.signing); None: signatures are not checked
        self.trust = trust
        self.uid = os.geteuid() if uid is None else uid  # the run's account: the daemon runs as it
        self.reads = ParallelReads(backend, workers, chunk_size, bandwidth_bytes_s, read_attempts, monotonic)

    # ----------------------------------------------------------------- entry point

    def verify(self, ref: CheckpointRef, level: Level, *, deadline_s: float | None = None) -> VerifyResult:
        started = self.monotonic()
        limit = deadline_s if deadline_s is not None else self.deadline_s
        try:
            prefix = relative_prefix(self.backend, ref.location)
        except ValueError as exc:
            return self._result(ref, level, started, _Found(Outcome.UNVERIFIABLE, str(exc)))
        run = VerifyRun(ref, level, prefix, started, started + limit if limit else None, self.monotonic)
        try:
            found = self._verify(run)
        except StorageError as exc:
            found = _Found(Outcome.UNVERIFIABLE, f"storage error: {exc}")
        except Stopped as exc:
            found = _Found(Outcome.UNVERIFIABLE, f"stopped: {exc}")
        finally:
            run.halt("verification over")
        result = self._result(ref, level, started, found, run.bytes_read)
        log.info(
            "ckpt.verified",
            location=ref.location,
            level=level.value,
            outcome=result.outcome.value,
            reason=result.reason,
            seconds=round(result.seconds, 3),
            bytes_read=run.bytes_read,
        )
        return result

    def _result(
        self, ref: CheckpointRef, level: Level, started: float, found: _Found, bytes_read: int = 0
    ) -> VerifyResult:
        return VerifyResult(
            ref.location,
            ref.step,
            level,
            found.outcome,
            found.reason,
            ref.guarantee,
            found.problems,
            found.shards,
            bytes_read if level is Level.FULL else found.bytes,
            self.monotonic() - started,
            self.clock.now(),
        )

    def _verify(self, run: VerifyRun) -> _Found:
        if run.ref.guarantee is Guarantee.MANIFEST:
            return self._verify_manifest(run)
        return self._verify_adopted(run)

    # ----------------------------------------------------------------- our manifest layout

    def _verify_manifest(self, run: VerifyRun) -> _Found:
        manifest, listing, raw = self._manifest(run)
        if isinstance(manifest, _Found):
            return manifest
        run.check()
        found, why = manifest_origin(raw, self.key)
        problems = signature_problems(self.trust, found, why) + self._ownership(run, listing.values())
        more, failure = self._manifest_problems(run, manifest, listing)
        return _judge(
            problems + more,
            failure,
            len(manifest.shards),
            manifest.total_bytes,
            f"{len(manifest.shards)} shards, {manifest.total_bytes} bytes match the manifest "
            f"(step {manifest.step}, {manifest.algorithm.value}); {why if found is not Origin.SIGNED else 'signed'}",
        )

    def _ownership(self, run: VerifyRun, objects: Iterable[ObjectInfo]) -> list[ShardProblem]:
        """Files and folders of the checkpoint another account owns (POSIX; under ``strict`` also the
        root and the folders above the checkpoint, and anything group or others may write)."""
        folders = getattr(self.backend, "folders", None)
        above, within = folders(run.prefix) if folders is not None else ([], [])
        checked = [*within, *objects, *(above if self.trust is Trust.STRICT else [])]
        return ownership_problems(checked, self.uid, self.trust)

    def _manifest(self, run: VerifyRun) -> tuple[Manifest | _Found, dict[str, ObjectInfo], bytes]:
        """The checkpoint's manifest and its listing; or, when there is no manifest to read, what
        that makes the checkpoint (torn, in progress, or a committed one that lost its marker)."""
        try:
            raw = self.backend.get_small(run.prefix + MANIFEST_NAME)
        except ValueError as exc:
            return _corrupt(ShardProblem(MANIFEST_NAME, "manifest", f"unreadable: {exc}")), {}, b""
        run.check()
        listing = {o.key[len(run.prefix) :]: o for o in self.backend.list(run.prefix)}
        if raw is None:
            if not run.ref.committed:
                return self._uncommitted(run, listing.values()), listing, b""
            gone = "missing: the commit marker of a committed checkpoint is gone"
            return _corrupt(ShardProblem(MANIFEST_NAME, "manifest", gone)), listing, b""
        try:
            return Manifest.from_json(raw), listing, raw
        except ManifestError as exc:
            return _corrupt(ShardProblem(MANIFEST_NAME, "manifest", str(exc))), listing, raw

    def _manifest_problems(
        self, run: VerifyRun, manifest: Manifest, listing: dict[str, ObjectInfo]
    ) -> tuple[list[ShardProblem], str | None]:
        """What the storage holds against the manifest: the listing (with HEADs, at metadata level),
        and every shard's bytes at full level; and why some shards could not be checked, if so."""
        failure = None
        if run.level is Level.METADATA:
            listing, failure = self._with_heads(run, manifest, listing)
        problems = list(check_listing(manifest, listing, name=run.ref.name))
        if run.level is Level.FULL:
            keys = [s.key for s in manifest.shards if s.key in listing and listing[s.key].size == s.size]
            digests, missing, failure = self.reads.digests(run, keys, manifest.algorithm)
            problems += check_digests(manifest, digests)
            problems += _vanished(missing)
        return problems, failure

    def _with_heads(
        self, run: VerifyRun, manifest: Manifest, listing: Mapping[str, ObjectInfo]
    ) -> tuple[dict[str, ObjectInfo], str | None]:
        """The listing, with each shard's HEAD where the listing lacks its stored checksum; and why
        some HEADs were not done, if they were not."""
        if not getattr(self.backend, "stores_checksums", True):
            return dict(listing), None
        algo = manifest.algorithm
        wanted = [
            s.key
            for s in manifest.shards
            if s.key in listing and listing[s.key].size == s.size and algo.value not in listing[s.key].checksums
        ]
        heads, failure = self._heads(run, manifest, wanted)
        return _merged(listing, heads), failure

    def _heads(self, run: VerifyRun, manifest: Manifest, wanted: list[str]) -> tuple[dict[str, object], str | None]:
        """HEAD the wanted shards. HEADs only tell what a listing does not (a stored checksum, a
        version): when a first batch shows the storage keeps neither for this checkpoint, the rest
        would be wasted requests and are skipped."""
        algo = manifest.algorithm

        def head(key: str) -> ObjectInfo | None:
            return self.backend.head(run.prefix + key, algo)

        sample = wanted[: self.workers]
        heads, failure = self.reads.each(run, sample, head)
        useful = any(isinstance(h, ObjectInfo) and (algo.value in h.checksums or h.version_id) for h in heads.values())
        if useful or any(s.version_id for s in manifest.shards):
            rest, failure_rest = self.reads.each(run, wanted[len(sample) :], head)
            heads.update(rest)
            failure = failure or failure_rest
        elif not failure and len(wanted) > len(sample):
            log.info(
                "ckpt.heads_skipped",
                location=run.ref.location,
                algorithm=algo.value,
                skipped=len(wanted) - len(sample),
                why="no stored checksum or version in the first HEADs",
            )
        return heads, failure

    # ----------------------------------------------------------------- adopted layouts

    def _verify_adopted(self, run: VerifyRun) -> _Found:
        ref, prefix = run.ref, run.prefix
        objects = self._adopted_objects(prefix)
        if not ref.committed:
            return self._uncommitted(run, objects)
        context = objects + (self._beside(prefix) if ref.guarantee is Guarantee.NEMO else [])
        run.check()
        problems = adopted_problems(self.trust, ref.name) + self._ownership(run, objects)
        problems += check_adopted(ref, context, prefix=prefix.rstrip("/"))
        failure = None
        if run.level is Level.FULL and objects:
            read_problems, failure = self._read_all(run, objects)
            problems += read_problems
        total = sum(o.size for o in objects)
        return _judge(
            problems,
            failure,
            len(objects),
            total,
            f"{len(objects)} objects, {total} bytes present; weak guarantee: {ref.guarantee.describe}; {UNVOUCHED}",
        )

    def _adopted_objects(self, prefix: str) -> list[ObjectInfo]:
        """The objects under the checkpoint's prefix, or the one object a single-file checkpoint
        (NeMo ``.ckpt``) is."""
        objects = list(self.backend.list(prefix))
        if not objects and prefix:
            single = self.backend.head(prefix.rstrip("/"))
            objects = [single] if single is not None else []
        return objects

    def _beside(self, prefix: str) -> list[ObjectInfo]:
        """The objects next to the checkpoint (NeMo's ``-unfinished`` marker lies there)."""
        parent = prefix.rstrip("/").rpartition("/")[0]
        return [
            o
            for o in self.backend.list(parent + "/" if parent else "")
            if o.key.count("/") == parent.count("/") + (1 if parent else 0)
        ]

    def _read_all(self, run: VerifyRun, objects: list[ObjectInfo]) -> tuple[list[ShardProblem], str | None]:
        """Every byte of every object read once, its count compared with the listing's size."""
        sizes = {o.key: o.size for o in objects}
        digests, missing, failure = self.reads.digests(run, sorted(sizes), ChecksumAlgorithm.CRC32C, rooted=True)
        problems = [
            ShardProblem(k, "size", f"read {got} bytes, listing says {sizes[k]}")
            for k, (got, _) in sorted(digests.items())
            if got != sizes[k]
        ]
        return problems + _vanished(missing), failure

    # ----------------------------------------------------------------- torn or in progress

    def _uncommitted(self, run: VerifyRun, objects: Iterable[ObjectInfo]) -> _Found:
        times = [o.modified_at for o in objects if o.modified_at is not None]
        objects = list(objects)
        if not objects:
            return _corrupt(ShardProblem(run.ref.name, "missing", "no objects under the checkpoint"))
        newest = max(times) if times else run.ref.seen_at
        age = self.clock.now() - newest if newest else None
        if age is not None and age > self.uncommitted_grace_s:
            return _corrupt(
                ShardProblem(
                    run.ref.name,
                    "uncommitted",
                    f"{len(objects)} objects without a commit marker, the newest written "
                    f"{age:.0f} s ago (grace {self.uncommitted_grace_s:.0f} s): a torn upload",
                )
            )
        when = f"newest object {age:.0f} s old" if age is not None else "object times unknown"
        return _Found(
            Outcome.UNVERIFIABLE,
            f"commit marker not written yet ({when}; torn after "
            f"{self.uncommitted_grace_s:.0f} s): an upload may be in progress",
            shards=len(objects),
        )


def _corrupt(problem: ShardProblem) -> _Found:
    return _Found(Outcome.CORRUPT, summarize([problem]), (problem,))


def _judge(problems: Sequence[ShardProblem], failure: str | None, shards: int, total: int, ok: str) -> _Found:
    """Definite evidence of damage wins; then any failure to look makes it unverifiable."""
    if problems:
        return _Found(Outcome.CORRUPT, summarize(problems), tuple(problems), shards, total)
    if failure:
        return _Found(Outcome.UNVERIFIABLE, f"not every shard could be checked: {failure}", (), shards, total)
    return _Found(Outcome.VERIFIED, ok, (), shards, total)


def _vanished(keys: Iterable[str]) -> list[ShardProblem]:
    return [ShardProblem(k, "missing", "vanished between the listing and the read") for k in keys]


def _merged(listing: Mapping[str, ObjectInfo], heads: Mapping[str, object]) -> dict[str, ObjectInfo]:
    """The listing, updated by what the HEADs found (None: deleted since the listing)."""
    merged = dict(listing)
    for key, info in heads.items():
        if info is None:
            merged.pop(key, None)  # deleted since the listing: reported missing
        elif isinstance(info, ObjectInfo):
            merged[key] = ObjectInfo(key, info.size, info.checksums, info.version_id, info.modified_at)
    return merged
