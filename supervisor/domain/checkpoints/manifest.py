"""Checkpoints: the manifest contract, what a verification found, and which checkpoint to resume from.

A checkpoint is a prefix (S3) or a directory (POSIX) of shards plus a manifest, written last as
the commit marker. The manifest names every shard with its size and checksum, so a reader can
tell a complete checkpoint from a torn, truncated or bit-flipped one without trusting the writer
process to have finished. Layouts without our manifest (PyTorch DCP, Megatron, NeMo) are adopted
with weaker, labelled guarantees.

Everything here is pure: adapters list, HEAD and read storage and hand the facts to these
functions, which decide. The checks of a listing or of the bytes read against a manifest are
domain.checkpoints.checks; those of adopted layouts, domain.checkpoints.adopted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from supervisor.domain.checkpoints.signing import Origin, origin, signed_json

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

    def to_json(self, key: bytes | None = None) -> str:
        """The manifest's text; signed (``domain.checkpoints.signing``) when ``key`` is given."""
        doc: dict[str, Any] = {
            "format": MANIFEST_FORMAT,
            "step": self.step,
            "algorithm": self.algorithm.value,
            "created_at": self.created_at,
            "run": self.run,
            "shards": [_shard_json(s) for s in self.shards],
        }
        if self.extra:
            doc["extra"] = dict(self.extra)
        return signed_json(doc, key) if key is not None else json.dumps(doc, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        doc = _document(text)
        algorithm = _algorithm(doc)
        step = doc.get("step")
        shards = doc.get("shards")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ManifestError(f"manifest step {step!r} is not a non-negative integer")
        if not isinstance(shards, list):
            raise ManifestError("manifest has no shard list")
        extra = doc.get("extra") or {}
        return cls(
            step,
            _shard_entries(shards),
            algorithm,
            float(doc.get("created_at") or 0.0),
            doc.get("run"),
            extra if isinstance(extra, dict) else {},
        )


def manifest_origin(text: str | bytes, key: bytes | None) -> tuple[Origin, str]:
    """Who vouches for the manifest ``text`` (already read by ``Manifest.from_json``) under ``key``."""
    return origin(_document(text), key)


def _shard_json(s: ShardEntry) -> dict[str, Any]:
    fields = (
        ("key", s.key),
        ("size", s.size),
        ("checksum", s.checksum),
        ("version_id", s.version_id),
        ("writer", s.writer),
        ("written_at", s.written_at),
    )
    return {k: v for k, v in fields if v is not None}


def _document(text: str | bytes) -> dict[str, Any]:
    """The manifest's JSON object, of our format."""
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
    return doc


def _algorithm(doc: Mapping[str, Any]) -> ChecksumAlgorithm:
    try:
        return ChecksumAlgorithm(doc.get("algorithm", "crc64nvme"))
    except ValueError as exc:
        allowed = ", ".join(a.value for a in ChecksumAlgorithm)
        raise ManifestError(f"manifest algorithm {doc.get('algorithm')!r} is not one of {allowed}") from exc


def _shard_entries(shards: list[Any]) -> tuple[ShardEntry, ...]:
    seen: set[str] = set()
    return tuple(_shard_entry(i, s, seen) for i, s in enumerate(shards))


def _shard_entry(i: int, s: Any, seen: set[str]) -> ShardEntry:
    """Shard ``i`` of the manifest, checked; its key is added to ``seen`` (a key listed twice is an error)."""
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
    return ShardEntry(key, size, checksum, s.get("version_id"), s.get("writer"), s.get("written_at"))


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
    owner: int | None = None  # POSIX: the file's UID (a symlink's own when another made it); None on S3
    mode: int | None = None  # POSIX: its permission bits


@dataclass(frozen=True)
class ShardProblem:
    key: str
    problem: str  # "missing", "size", "checksum", "unreadable", "manifest", "stale", "uncommitted", "origin"
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
        why = _passed_over(ref, results.get(ref.location), allow_weak)
        if why is None:
            good.append(ref)
        elif not good:
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


def _passed_over(ref: CheckpointRef, result: VerifyResult | None, allow_weak: bool) -> str | None:
    """Why ``ref`` cannot be resumed from; None when it can."""
    if not ref.committed:
        return "no commit marker (torn or still uploading)"
    if result is None:
        return "not verified yet"
    if result.outcome is not Outcome.VERIFIED:
        return f"{result.level.value} verification: {result.outcome.value}: {result.reason}"
    if ref.guarantee.weak and not allow_weak:
        return f"{ref.guarantee.value} layouts are not allowed by the run's policy"
    return None


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
