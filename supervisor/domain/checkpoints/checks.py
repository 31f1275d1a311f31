"""Pure checks of a manifest checkpoint: a listing (metadata level) or the bytes read (full level)
against its manifest, and the step a checkpoint's name carries.

Adapters list, HEAD and read storage and hand the facts here; the problems found are values
(``ShardProblem``), summed up for people by ``summarize``. Adopted layouts: domain.checkpoints.adopted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from supervisor.domain.checkpoints.manifest import MANIFEST_NAME, Manifest, ObjectInfo, ShardEntry, ShardProblem

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
    problems = _stale_name(manifest, name)
    algo = manifest.algorithm.value
    for shard in manifest.shards:
        info = listing.get(shard.key)
        if info is None:
            problems.append(ShardProblem(shard.key, "missing", "listed in the manifest, absent from storage"))
        elif info.size != shard.size:
            problems.append(ShardProblem(shard.key, "size", f"{info.size} bytes stored, manifest says {shard.size}"))
        else:
            problems += _stored_problems(shard, info, algo, require_stored_checksum)
    return tuple(problems)


def _stale_name(manifest: Manifest, name: str | None) -> list[ShardProblem]:
    named_step = step_from_name(name) if name else None
    if named_step is None or named_step == manifest.step:
        return []
    detail = f"manifest is for step {manifest.step}, checkpoint is named for step {named_step}"
    return [ShardProblem(MANIFEST_NAME, "stale", detail)]


def _stored_problems(shard: ShardEntry, info: ObjectInfo, algo: str, require_checksum: bool) -> list[ShardProblem]:
    """A present shard of the right size: its stored checksum and object version against the manifest."""
    problems = []
    stored = info.checksums.get(algo)
    if stored is not None and stored != shard.checksum:
        detail = f"stored {algo} {stored} differs from the manifest's {shard.checksum}"
        problems.append(ShardProblem(shard.key, "checksum", detail))
    elif stored is None and require_checksum:
        problems.append(ShardProblem(shard.key, "checksum", f"storage keeps no {algo} checksum for it"))
    if shard.version_id and info.version_id and shard.version_id != info.version_id:
        detail = f"object version {info.version_id} is not the manifest's {shard.version_id}"
        problems.append(ShardProblem(shard.key, "stale", detail))
    return problems


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
            detail = f"computed {manifest.algorithm.value} {checksum}, manifest says {shard.checksum}"
            problems.append(ShardProblem(shard.key, "checksum", detail))
    return tuple(problems)


def summarize(problems: Sequence[ShardProblem], what: str = "checkpoint") -> str:
    """The first problem and how many more, or that the checkpoint matches its manifest."""
    if not problems:
        return f"{what} matches its manifest"
    first = problems[0]
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{first.key}: {first.problem}: {first.detail}{more}"
