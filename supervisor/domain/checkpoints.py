"""Checkpoints: the manifest contract, what a verification found, and which checkpoint to resume from.

A checkpoint is a prefix (S3) or a directory (POSIX) of shards plus a manifest, written last as
the commit marker. The manifest names every shard with its size and checksum, so a reader can
tell a complete checkpoint from a torn, truncated or bit-flipped one without trusting the writer
process to have finished. Layouts without our manifest (PyTorch DCP, Megatron, NeMo) are adopted
with weaker, labelled guarantees.

Everything here is pure: adapters list, HEAD and read storage and hand the facts to these
functions, which decide.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

MANIFEST_NAME = "ssv-manifest.json"
MANIFEST_FORMAT = 1


class ChecksumAlgorithm(StrEnum):
    """Checksums a manifest may carry. Values are S3's encoding: base64 of the big-endian digest."""

    CRC64NVME = "crc64nvme"  # default: fast (awscrt), and S3's own full-object checksum
    CRC32C = "crc32c"
    SHA256 = "sha256"

    @property
    def s3_name(self) -> str:
        """The name S3 uses in ``ChecksumAlgorithm`` and the ``Checksum<NAME>`` response fields."""
        return self.value.upper()


class Guarantee(StrEnum):
    """How much a verified checkpoint of this layout is worth."""

    MANIFEST = "manifest"  # ours: every shard's size and checksum, written last as the commit marker
    DCP = "adopted-dcp"  # PyTorch DCP: ``.metadata`` written last; shard files listed, no checksums
    MEGATRON = "adopted-megatron"  # ``iter_NNNNNNN/`` named by ``latest_checkpointed_iteration.txt``
    NEMO = "adopted-nemo"  # a NeMo checkpoint without its ``-unfinished`` marker

    @property
    def weak(self) -> bool:
        """True when a bit flip or a truncated shard could pass verification unnoticed."""
        return self is not Guarantee.MANIFEST

    @property
    def describe(self) -> str:
        return _GUARANTEE_TEXT[self]


_GUARANTEE_TEXT = {
    Guarantee.MANIFEST: "supervisor manifest: sizes and checksums of every shard, commit marker",
    Guarantee.DCP: "adopted PyTorch DCP layout: .metadata present and its files listed; no checksums",
    Guarantee.MEGATRON: "adopted Megatron layout: iteration directory named by the tracker file; presence only",
    Guarantee.NEMO: "adopted NeMo layout: no -unfinished marker; presence only",
}


class Level(StrEnum):
    METADATA = "metadata"  # list + HEAD against the manifest: presence, size, stored checksum
    FULL = "full"  # every byte read and its checksum computed and compared


class Outcome(StrEnum):
    VERIFIED = "verified"
    CORRUPT = "corrupt"  # the storage answered, and what it holds does not match the manifest
    UNVERIFIABLE = "unverifiable"  # the storage did not answer well enough to tell: never "corrupt"


class ManifestError(ValueError):
    """A manifest that cannot be read: not JSON, wrong shape, unknown algorithm."""


@dataclass(frozen=True)
class ShardEntry:
    key: str  # relative to the checkpoint's root, "/"-separated
    size: int
    checksum: str  # base64 of the big-endian digest (S3's encoding)
    version_id: str | None = None  # S3 object version when the bucket is versioned
    writer: str | None = None  # rank or host that wrote it
    written_at: float | None = None


@dataclass(frozen=True)
class Manifest:
    step: int
    shards: tuple[ShardEntry, ...]
    algorithm: ChecksumAlgorithm = ChecksumAlgorithm.CRC64NVME
    created_at: float = 0.0
    run: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.shards)

    def to_json(self) -> str:
        doc: dict[str, Any] = {
            "format": MANIFEST_FORMAT,
            "step": self.step,
            "algorithm": self.algorithm.value,
            "created_at": self.created_at,
            "run": self.run,
            "shards": [
                {
                    k: v
                    for k, v in (
                        ("key", s.key),
                        ("size", s.size),
                        ("checksum", s.checksum),
                        ("version_id", s.version_id),
                        ("writer", s.writer),
                        ("written_at", s.written_at),
                    )
                    if v is not None
                }
                for s in self.shards
            ],
        }
        if self.extra:
            doc["extra"] = dict(self.extra)
        return json.dumps(doc, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        try:
            doc = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ManifestError(f"manifest is not JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise ManifestError("manifest is not a JSON object")
        if doc.get("format") != MANIFEST_FORMAT:
            raise ManifestError(
                f"manifest format {doc.get('format')!r} is not {MANIFEST_FORMAT}; "
                "upgrade slurm-supervisor or rewrite the manifest"
            )
        try:
            algorithm = ChecksumAlgorithm(doc.get("algorithm", "crc64nvme"))
        except ValueError as exc:
            allowed = ", ".join(a.value for a in ChecksumAlgorithm)
            raise ManifestError(f"manifest algorithm {doc.get('algorithm')!r} is not one of {allowed}") from exc
        step = doc.get("step")
        shards = doc.get("shards")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ManifestError(f"manifest step {step!r} is not a non-negative integer")
        if not isinstance(shards, list):
            raise ManifestError("manifest has no shard list")
        entries = []
        seen: set[str] = set()
        for i, s in enumerate(shards):
            if not isinstance(s, dict):
                raise ManifestError(f"manifest shard {i} is not an object")
            key, size, checksum = s.get("key"), s.get("size"), s.get("checksum")
            if not isinstance(key, str) or not key or key.startswith("/") or ".." in key.split("/"):
                raise ManifestError(f"manifest shard {i} has a bad key {key!r} (relative, no '..')")
            if key in seen:
                raise ManifestError(f"manifest lists shard {key!r} twice")
            seen.add(key)
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise ManifestError(f"manifest shard {key!r} has a bad size {size!r}")
            if not isinstance(checksum, str) or not checksum:
                raise ManifestError(f"manifest shard {key!r} has no checksum")
            entries.append(ShardEntry(key, size, checksum, s.get("version_id"), s.get("writer"), s.get("written_at")))
        extra = doc.get("extra") or {}
        return cls(
            step,
            tuple(entries),
            algorithm,
            float(doc.get("created_at") or 0.0),
            doc.get("run"),
            extra if isinstance(extra, dict) else {},
        )


@dataclass(frozen=True)
class CheckpointRef:
    """A checkpoint found in storage (not yet known to be good)."""

    location: str  # "s3://bucket/prefix/step_000100/" or "/lustre/run/ckpt/step_000100"
    name: str  # the last component, for people
    step: int | None  # from the manifest, the layout or the name; None when it cannot be told
    guarantee: Guarantee
    committed: bool = True  # False: shards present but no commit marker (yet): torn or in progress
    seen_at: float = 0.0  # newest object time under it, when known


@dataclass(frozen=True)
class ObjectInfo:
    """What storage says of one object, from a listing or a HEAD."""

    key: str  # relative to the checkpoint root
    size: int
    checksums: Mapping[str, str] = field(default_factory=dict)  # algorithm value -> base64, as stored
    version_id: str | None = None
    modified_at: float | None = None


@dataclass(frozen=True)
class ShardProblem:
    key: str
    problem: str  # "missing", "size", "checksum", "unreadable", "manifest", "stale", "uncommitted"
    detail: str


@dataclass(frozen=True)
class VerifyResult:
    location: str
    step: int | None
    level: Level
    outcome: Outcome
    reason: str
    guarantee: Guarantee = Guarantee.MANIFEST
    problems: tuple[ShardProblem, ...] = ()
    shards: int = 0
    bytes: int = 0
    seconds: float = 0.0
    at: float = 0.0

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.VERIFIED

    def evidence(self) -> dict[str, Any]:
        return {
            "location": self.location,
            "step": self.step,
            "level": self.level.value,
            "outcome": self.outcome.value,
            "reason": self.reason,
            "guarantee": self.guarantee.value,
            "shards": self.shards,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "problems": [{"key": p.key, "problem": p.problem, "detail": p.detail} for p in self.problems[:20]],
            "problems_total": len(self.problems),
        }


# --------------------------------------------------------------------------- pure checks

_STEP_IN_NAME = re.compile(r"(\d+)(?!.*\d)")


def step_from_name(name: str) -> int | None:
    """The last run of digits in a checkpoint's name: ``step_000100`` -> 100, ``iter_0002000`` -> 2000."""
    m = _STEP_IN_NAME.search(name.rstrip("/").rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def check_listing(
    manifest: Manifest,
    listing: Mapping[str, ObjectInfo],
    *,
    name: str | None = None,
    require_stored_checksum: bool = False,
) -> tuple[ShardProblem, ...]:
    """Metadata verification: every manifest shard present with its size and, where the storage
    keeps one for the manifest's algorithm, its checksum. ``listing`` maps relative keys to what a
    listing or HEAD returned. A manifest whose step disagrees with the checkpoint's name is stale.
    """
    problems: list[ShardProblem] = []
    named_step = step_from_name(name) if name else None
    if named_step is not None and named_step != manifest.step:
        problems.append(
            ShardProblem(
                MANIFEST_NAME,
                "stale",
                f"manifest is for step {manifest.step}, checkpoint is named for step {named_step}",
            )
        )
    algo = manifest.algorithm.value
    for shard in manifest.shards:
        info = listing.get(shard.key)
        if info is None:
            problems.append(ShardProblem(shard.key, "missing", "listed in the manifest, absent from storage"))
            continue
        if info.size != shard.size:
            problems.append(ShardProblem(shard.key, "size", f"{info.size} bytes stored, manifest says {shard.size}"))
            continue
        stored = info.checksums.get(algo)
        if stored is not None and stored != shard.checksum:
            problems.append(
                ShardProblem(
                    shard.key, "checksum", f"stored {algo} {stored} differs from the manifest's {shard.checksum}"
                )
            )
        elif stored is None and require_stored_checksum:
            problems.append(ShardProblem(shard.key, "checksum", f"storage keeps no {algo} checksum for it"))
        if shard.version_id and info.version_id and shard.version_id != info.version_id:
            problems.append(
                ShardProblem(
                    shard.key, "stale", f"object version {info.version_id} is not the manifest's {shard.version_id}"
                )
            )
    return tuple(problems)


def check_digests(manifest: Manifest, digests: Mapping[str, tuple[int, str]]) -> tuple[ShardProblem, ...]:
    """Full verification: the bytes read (size, computed checksum) of every shard against the manifest.
    A shard absent from ``digests`` was not read (the caller reports why) and is not judged here."""
    problems: list[ShardProblem] = []
    for shard in manifest.shards:
        got = digests.get(shard.key)
        if got is None:
            continue
        size, checksum = got
        if size != shard.size:
            problems.append(ShardProblem(shard.key, "size", f"read {size} bytes, manifest says {shard.size}"))
        elif checksum != shard.checksum:
            problems.append(
                ShardProblem(
                    shard.key,
                    "checksum",
                    f"computed {manifest.algorithm.value} {checksum}, manifest says {shard.checksum}",
                )
            )
    return tuple(problems)


def summarize(problems: Sequence[ShardProblem], what: str = "checkpoint") -> str:
    if not problems:
        return f"{what} matches its manifest"
    first = problems[0]
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{first.key}: {first.problem}: {first.detail}{more}"


# --------------------------------------------------------------------------- choosing where to resume


@dataclass(frozen=True)
class ResumeChoice:
    chosen: CheckpointRef | None
    fallbacks: tuple[CheckpointRef, ...]  # older verified ones, newest first, to try if it fails to load
    skipped: tuple[tuple[CheckpointRef, str], ...]  # newer ones passed over, and why
    reason: str


def choose_resume(
    checkpoints: Iterable[CheckpointRef],
    results: Mapping[str, VerifyResult],
    *,
    before_step: int | None = None,
    allow_weak: bool = True,
) -> ResumeChoice:
    """The newest checkpoint whose latest verification succeeded (and, for a rollback, whose step
    is at most ``before_step``), older verified ones as fallbacks. Never a corrupt, torn or
    unverified one: those are listed in ``skipped`` with the reason, for the logbook."""
    ordered = sorted((c for c in checkpoints if c.step is not None), key=lambda c: c.step or 0, reverse=True)
    good: list[CheckpointRef] = []
    skipped: list[tuple[CheckpointRef, str]] = []
    for ref in ordered:
        if before_step is not None and (ref.step or 0) > before_step:
            continue
        result = results.get(ref.location)
        if not ref.committed:
            why = "no commit marker (torn or still uploading)"
        elif result is None:
            why = "not verified yet"
        elif result.outcome is not Outcome.VERIFIED:
            why = f"{result.level.value} verification: {result.outcome.value}: {result.reason}"
        elif ref.guarantee.weak and not allow_weak:
            why = f"{ref.guarantee.value} layouts are not allowed by the run's policy"
        else:
            good.append(ref)
            continue
        if not good:
            skipped.append((ref, why))
    if not good:
        limit = f" at or before step {before_step}" if before_step is not None else ""
        return ResumeChoice(None, (), tuple(skipped), f"no verified checkpoint{limit}")
    chosen = good[0]
    res = results[chosen.location]
    weak = f"; {chosen.guarantee.describe}" if chosen.guarantee.weak else ""
    passed = f"; skipped {len(skipped)} newer" if skipped else ""
    return ResumeChoice(
        chosen, tuple(good[1:]), tuple(skipped), f"step {chosen.step}: {res.level.value}-verified{weak}{passed}"
    )


def effective_result(metadata: VerifyResult | None, full: VerifyResult | None) -> VerifyResult | None:
    """What is known of a checkpoint: a full verification's verdict wins when it reached one; an
    unverifiable full pass leaves the metadata verdict standing (storage trouble proves nothing)."""
    if full is not None and full.outcome is not Outcome.UNVERIFIABLE:
        return full
    if metadata is not None:
        return metadata
    return full


def staleness(
    now: float, since: float, newest_verified_at: float | None, expected_interval_s: float | None, intervals: float
) -> float | None:
    """Seconds without a verified checkpoint when that exceeds ``intervals`` × the expected
    interval, else None. ``since``: when the run's current stretch of work began."""
    if not expected_interval_s:
        return None
    start = max(since, newest_verified_at or since)
    age = now - start
    return age if age > intervals * expected_interval_s else None
