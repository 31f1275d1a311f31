"""The trainer's side of the checkpoint contract: describe a finished checkpoint, then commit it.

A training script saves its shards as it always does (``torch.distributed.checkpoint.save``,
``torch.save`` per rank, an S3 upload...), waits for every rank, and then on ONE rank writes the
manifest, last, as the commit marker::

    from supervisor.adapters.checkpoints.commit import build_manifest, commit_checkpoint
    from supervisor.adapters.checkpoints.posix import PosixBackend

    name = f"step_{step:06d}"
    dcp.save(state, checkpoint_id=f"/lustre/proj/run42/ckpt/{name}")
    torch.distributed.barrier()                  # every rank's shards are written
    if torch.distributed.get_rank() == 0:
        backend = PosixBackend("/lustre/proj/run42/ckpt")
        manifest = build_manifest(backend, name, step, writer=socket.gethostname(), run="run42")
        commit_checkpoint(backend, name, manifest)   # ssv-manifest.json, written once
    torch.distributed.barrier()                  # nobody deletes older checkpoints before the commit

The same from a shell: ``slurm-supervisor ckpt commit /lustre/proj/run42/ckpt step_000100 --step 100``.

``build_manifest`` takes each shard's checksum from the storage when it keeps one for the
algorithm (S3 keeps a full-object CRC64NVME when the upload asked for it, so nothing is re-read)
and otherwise streams the shard and computes it: shards in parallel, one bounded chunk at a time.
A trainer that checksums local files before uploading them uses ``manifest_for_files``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

import structlog

from supervisor.adapters.checkpoints.backend import ObjectBackend, StorageError
from supervisor.adapters.checkpoints.checksums import Digest
from supervisor.adapters.checkpoints.posix import PosixBackend
from supervisor.domain.checkpoints.checks import step_from_name
from supervisor.domain.checkpoints.manifest import (
    MANIFEST_NAME,
    ChecksumAlgorithm,
    Manifest,
    ObjectInfo,
    ShardEntry,
)
from supervisor.domain.checkpoints.signing import KEY_ENV, parse_key

log = structlog.get_logger(__name__)

CHUNK = 1 << 20  # bytes in flight per worker while checksumming


class AlreadyCommitted(Exception):
    """The checkpoint already has its manifest: a commit marker is written once, never replaced."""

    def __init__(self, location: str) -> None:
        super().__init__(
            f"{location} already has {MANIFEST_NAME}: a checkpoint is committed once and its "
            "manifest is never overwritten; save to a new name (e.g. a new step) instead"
        )
        self.location = location


def checkpoint_name(name: str) -> str:
    """``name`` as a relative prefix without slashes at its ends; ValueError for one that is not."""
    clean = name.strip("/")
    parts = clean.split("/")
    if not clean or any(p in ("", ".", "..") for p in parts) or "\0" in clean:
        raise ValueError(
            f"checkpoint name {name!r} must be a relative path under the root, without '..' (e.g. step_000100)"
        )
    return clean


def build_manifest(
    backend: ObjectBackend,
    name: str,
    step: int,
    *,
    algorithm: ChecksumAlgorithm = ChecksumAlgorithm.CRC64NVME,
    writer: str | None = None,
    workers: int = 8,
    run: str | None = None,
    clock: Callable[[], float] = time.time,
) -> Manifest:
    """The manifest of the finished checkpoint ``name`` (a prefix under the backend's root): every
    object under it, with size and checksum. Raises AlreadyCommitted when it has a manifest,
    ValueError when it holds nothing, StorageError when the storage fails."""
    name = checkpoint_name(name)
    _check_step(step)
    if backend.head(f"{name}/{MANIFEST_NAME}") is not None:
        raise AlreadyCommitted(backend.location(f"{name}/"))
    listing = [o for o in backend.list(f"{name}/") if not _ours(o.key)]
    if not listing:
        raise ValueError(f"{backend.location(name + '/')} holds no shards: save the checkpoint before committing it")
    shards = checksum_objects(backend, listing, algorithm, workers=workers, strip=f"{name}/", writer=writer)
    log.info(
        "ckpt_manifest_built",
        location=backend.location(f"{name}/"),
        step=step,
        shards=len(shards),
        bytes=sum(s.size for s in shards),
        algorithm=algorithm.value,
    )
    return Manifest(step, shards, algorithm, clock(), run)


def manifest_for_files(
    source: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    step: int,
    *,
    root: str | os.PathLike[str] | None = None,
    algorithm: ChecksumAlgorithm = ChecksumAlgorithm.CRC64NVME,
    writer: str | None = None,
    workers: int = 8,
    run: str | None = None,
    clock: Callable[[], float] = time.time,
) -> Manifest:
    """The manifest of local files about to be uploaded: ``source`` is a directory (every file under
    it, keys relative to it) or a list of files (keys relative to ``root``, by default their
    common directory). Upload the files under the same keys, then ``commit_checkpoint``."""
    _check_step(step)
    base, listing = _local_files(source, root)
    listing = [o for o in listing if not _ours(o.key)]
    if not listing:
        raise ValueError("no files to describe: the directory is empty")
    shards = checksum_objects(base, listing, algorithm, workers=workers, strip="", writer=writer)
    return Manifest(step, shards, algorithm, clock(), run)


def _local_files(
    source: str | os.PathLike[str] | Iterable[str | os.PathLike[str]], root: str | os.PathLike[str] | None
) -> tuple[PosixBackend, list[ObjectInfo]]:
    """The backend over the files' top directory, and the files as its objects."""
    if isinstance(source, (str, os.PathLike)) and os.path.isdir(source):
        base = PosixBackend(os.fspath(source))
        return base, list(base.list(""))
    paths = (
        [os.path.abspath(os.fspath(source))]
        if isinstance(source, (str, os.PathLike))
        else [os.path.abspath(os.fspath(p)) for p in source]
    )
    if not paths:
        raise ValueError("no files given to describe")
    top = (
        os.path.abspath(os.fspath(root))
        if root is not None
        else os.path.commonpath([os.path.dirname(p) for p in paths])
    )
    base = PosixBackend(top)
    return base, [_named_file(base, top, p) for p in paths]


def _named_file(base: PosixBackend, top: str, path: str) -> ObjectInfo:
    rel = os.path.relpath(path, top)
    if rel.startswith(".." + os.sep) or rel == ".." or os.path.isabs(rel):
        raise ValueError(f"{path} is not under {top}: give a root above every file")
    info = base.head(rel.replace(os.sep, "/"))
    if info is None:
        raise ValueError(f"{path} is not a regular file")
    return info


def commit_checkpoint(backend: ObjectBackend, name: str, manifest: Manifest, *, key: bytes | None = None) -> str:
    """Write ``manifest`` as ``NAME/ssv-manifest.json`` with a write that never replaces an existing
    one; return the checkpoint's location. Raises AlreadyCommitted when a manifest is already there,
    ValueError when the manifest's step disagrees with the step in the name (verification would call
    it stale forever), StorageError when the storage fails.

    The manifest is signed with ``key``, or when that is None with the run's key the daemon hands
    the job in ``SSV_MANIFEST_KEY`` (domain.checkpoints.signing); unsigned when neither is there."""
    name = checkpoint_name(name)
    named = step_from_name(name)
    if named is not None and named != manifest.step:
        raise ValueError(
            f"manifest is for step {manifest.step} but the checkpoint {name!r} is named for step "
            f"{named}: commit it under the right name or with --step {named}"
        )
    location = backend.location(f"{name}/")
    key = key if key is not None else key_from_env()
    if not backend.put(f"{name}/{MANIFEST_NAME}", manifest.to_json(key).encode(), if_absent=True):
        raise AlreadyCommitted(location)
    log.info(
        "ckpt_committed",
        location=location,
        step=manifest.step,
        shards=len(manifest.shards),
        bytes=manifest.total_bytes,
        signed=key is not None,
    )
    return location


def key_from_env(env: Mapping[str, str] | None = None) -> bytes | None:
    """The run's manifest key from ``SSV_MANIFEST_KEY`` (None when unset); ValueError when malformed."""
    text = (os.environ if env is None else env).get(KEY_ENV)
    return parse_key(text) if text else None


# --------------------------------------------------------------------------- checksums


def checksum_objects(
    backend: ObjectBackend,
    listing: Iterable[ObjectInfo],
    algorithm: ChecksumAlgorithm,
    *,
    workers: int = 8,
    strip: str = "",
    writer: str | None = None,
    chunk_size: int = CHUNK,
) -> tuple[ShardEntry, ...]:
    """A ShardEntry per object, keys with ``strip`` removed, in key order: the stored checksum where
    the storage keeps a full-object one, else one computed from the bytes (``workers`` at a time)."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")

    def one(info: ObjectInfo) -> ShardEntry:
        stored = _full_object(info.checksums.get(algorithm.value))
        version = info.version_id
        if stored is None:
            head = backend.head(info.key, algorithm)
            if head is None:
                raise StorageError(
                    f"{backend.location(info.key)} vanished while the manifest was built: "
                    "is the checkpoint still being written or deleted?",
                    transient=False,
                )
            stored, version = _full_object(head.checksums.get(algorithm.value)), head.version_id or version
            if head.size != info.size:
                raise _changing(backend, info.key)
        checksum = stored if stored is not None else _digest(backend, info, algorithm, chunk_size)
        return ShardEntry(info.key[len(strip) :], info.size, checksum, version, writer, info.modified_at)

    items = sorted(listing, key=lambda o: o.key)
    if workers == 1 or len(items) < 2:
        return tuple(one(i) for i in items)
    with ThreadPoolExecutor(max_workers=min(workers, len(items)), thread_name_prefix="ssv-ckpt-sum") as pool:
        return tuple(pool.map(one, items))


def _digest(backend: ObjectBackend, info: ObjectInfo, algorithm: ChecksumAlgorithm, chunk_size: int) -> str:
    digest = Digest(algorithm)
    try:
        for chunk in backend.read(info.key, chunk_size):
            digest.update(chunk)
    except KeyError:
        raise StorageError(f"{backend.location(info.key)} vanished while it was checksummed", transient=False) from None
    if digest.size != info.size:
        raise _changing(backend, info.key)
    return digest.value()


def _changing(backend: ObjectBackend, key: str) -> StorageError:
    return StorageError(
        f"{backend.location(key)} changed size while the manifest was built: commit only after "
        "every rank has finished writing (a barrier, then one rank commits)",
        transient=False,
    )


def _full_object(value: str | None) -> str | None:
    """A stored checksum usable as the whole object's: S3 composite (per-part) ones end in "-N"."""
    return value if value and "-" not in value else None


def _ours(key: str) -> bool:
    """Our manifest and the temporary files a POSIX put leaves while it writes one."""
    base = key.rsplit("/", 1)[-1]
    return base == MANIFEST_NAME or base.startswith(f".{MANIFEST_NAME}.")


def _check_step(step: int) -> None:
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step {step!r} must be a non-negative integer")
