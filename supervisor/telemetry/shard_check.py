"""A trainer's own check of a checkpoint before it loads it: every shard against the supervisor's
manifest (``ssv-manifest.json``: each shard's size and checksum, docs/checkpoint-layouts.md).

The supervisor verifies a checkpoint when it appears and when its objects change, but a shard
damaged below the storage's API afterwards (bit rot: the same size and modification time) is not
looked at again, and ``torch.distributed.checkpoint`` loads it without noticing: the run trains on
from garbage. Reading the shards once more at resume (split over the ranks) turns that into a load
failure, which the trainer reports and falls back from.

Dependency-free but for awscrt (CRC64NVME / CRC32C, which slurm-supervisor and boto3's CRT
extra bring); without it only SHA-256 manifests are checked and the others are loaded unchecked.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

MANIFEST = "ssv-manifest.json"
CHUNK = 4 << 20


class ShardMismatch(ValueError):
    """A shard of the checkpoint is not what its manifest recorded."""


def check_shards(folder: Path, *, rank: int = 0, world: int = 1) -> int:
    """Check this rank's share of the shards (every ``world``-th, from the ``rank``-th) of the
    checkpoint in ``folder`` against its manifest. Returns how many were checked (0 without a
    manifest, e.g. an adopted layout, or without the checksum's library). ``ShardMismatch`` names
    the first shard that differs; ``OSError`` when one cannot be read."""
    path = folder / MANIFEST
    if not path.is_file():
        return 0
    doc = json.loads(path.read_text())
    digest = _digest(str(doc.get("algorithm", "")))
    if digest is None:
        return 0
    shards: list[dict[str, Any]] = list(doc.get("shards") or [])[rank::world]
    for shard in shards:
        key = str(shard["key"])
        if not key or key.startswith("/") or ".." in key.split("/"):
            raise ShardMismatch(f"{key!r}: not a key inside the checkpoint")
        size, checksum = digest(folder / key)
        if size != shard["size"]:
            raise ShardMismatch(f"{key}: size: {size} bytes, the manifest says {shard['size']}")
        if checksum != shard["checksum"]:
            raise ShardMismatch(f"{key}: checksum: {checksum}, the manifest says {shard['checksum']}")
    return len(shards)


def _digest(algorithm: str) -> Callable[[Path], tuple[int, str]] | None:
    """(size, base64 of the big-endian digest: S3's encoding) of a file, for ``algorithm``."""
    if algorithm == "sha256":
        return lambda path: _read(path, hashlib.sha256())
    try:
        from awscrt import checksums
    except ImportError:
        return None
    if algorithm == "crc64nvme":
        return lambda path: _crc(path, checksums.crc64nvme, 8)
    if algorithm == "crc32c":
        return lambda path: _crc(path, checksums.crc32c, 4)
    return None


def _read(path: Path, h: Any) -> tuple[int, str]:
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, base64.b64encode(h.digest()).decode()


def _crc(path: Path, update: Callable[[bytes, int], int], width: int) -> tuple[int, str]:
    crc, size = 0, 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            crc = update(chunk, crc)
            size += len(chunk)
    return size, base64.b64encode(crc.to_bytes(width, "big")).decode()
