"""Checkpoints in memory for tests: the real ``CheckpointStore`` over an in-memory object backend.

(Here in tests/, not in ``supervisor.testing``: that layer may not import the adapters this builds
on; pyproject's import-linter contract.)

There is one fake here, and it is low: ``MemoryBackend`` stands in for the *storage* (an
``ObjectBackend`` like ``PosixBackend`` and ``S3Backend``), and ``MemoryCheckpointStore`` is the
production ``BackendCheckpointStore`` on top of it. So discovery, verification at both levels,
torn uploads and storage trouble behave exactly as on a directory or a bucket; the backend runs the
same contract as the real ones (``tests/checkpoints/test_verify_contract.py``, kind ``memory``).

A test writes checkpoints as a trainer would and damages them as the world does::

    ckpt = MemoryCheckpointStore(clock)          # the store a CheckpointWatch is given
    ckpt.save(100)                               # shards, then the commit marker
    ckpt.save(200).flip_bit(1)                   # a bit flip at rest: only a full read sees it
    ckpt.save(300, committed=False)              # torn: the upload never finished
    ckpt.save(400).storage_down = True           # reads fail: unverifiable, never corrupt
    ckpt.listing_down = True                     # the root cannot be listed
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from supervisor.adapters.checkpoints.backend import StorageError
from supervisor.adapters.checkpoints.checksums import checksum_of
from supervisor.adapters.checkpoints.store import BackendCheckpointStore
from supervisor.domain.checkpoints.manifest import (
    MANIFEST_NAME,
    CheckpointRef,
    ChecksumAlgorithm,
    Level,
    Manifest,
    ObjectInfo,
    ShardEntry,
    VerifyResult,
)
from supervisor.ports import Clock

ROOT = "mem://ckpt/"


@dataclass
class _Object:
    data: bytes
    modified_at: float


class MemoryBackend:
    """``ObjectBackend`` on a dict: keys relative to ``root``, modification times from ``clock``
    (wall time by default), no stored checksums (like POSIX: metadata checks presence and size).

    Faults: ``listing_down`` makes every listing fail; a key under one of ``down`` (key prefixes)
    fails to read. Both raise a transient ``StorageError``, as a timeout would."""

    stores_checksums = False

    def __init__(self, root: str = ROOT, clock: Clock | None = None) -> None:
        self.root = root if root.endswith("/") else root + "/"
        self._now = clock.now if clock is not None else time.time
        self.objects: dict[str, _Object] = {}
        self.listing_down = False
        self.down: set[str] = set()

    def location(self, key: str) -> str:
        return self.root + key

    def _reachable(self, key: str) -> None:
        if any(key.startswith(prefix) for prefix in self.down):
            raise StorageError(f"{self.location(key)}: 503 SlowDown after 5 attempts")

    def _info(self, key: str) -> ObjectInfo:
        obj = self.objects[key]
        return ObjectInfo(key, len(obj.data), {}, None, obj.modified_at)

    # -- reading --------------------------------------------------------------------------------

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        if self.listing_down:
            raise StorageError(f"listing {self.location(prefix)}: listing timed out")
        return iter([self._info(k) for k in sorted(self.objects) if k.startswith(prefix)])

    def head(self, key: str, algorithm: ChecksumAlgorithm | None = None) -> ObjectInfo | None:
        self._reachable(key)
        return self._info(key) if key in self.objects else None

    def read(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        self._reachable(key)
        if key not in self.objects:
            raise KeyError(key)
        data = self.objects[key].data
        return iter([data[i : i + chunk_size] for i in range(0, len(data), chunk_size)])

    def get_small(self, key: str, max_bytes: int = 16 << 20) -> bytes | None:
        self._reachable(key)
        obj = self.objects.get(key)
        if obj is None:
            return None
        if len(obj.data) > max_bytes:
            raise ValueError(f"{self.location(key)} is {len(obj.data)} bytes, more than the {max_bytes} allowed here")
        return obj.data

    # -- writing --------------------------------------------------------------------------------

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        if not key or key.endswith("/"):
            raise ValueError(f"object key {key!r} names a directory, not an object")
        if if_absent and key in self.objects:
            return False
        self.objects[key] = _Object(bytes(data), self._now())
        return True

    # -- damage below the API -------------------------------------------------------------------

    def remove(self, key: str) -> None:
        del self.objects[key]

    def flip(self, key: str, offset: int) -> None:
        """Flip one bit at rest: size and modification time stay."""
        obj = self.objects[key]
        data = bytearray(obj.data)
        data[offset] ^= 1
        obj.data = bytes(data)


class SavedCheckpoint:
    """One checkpoint ``MemoryCheckpointStore.save`` wrote, and ways to damage it."""

    def __init__(self, backend: MemoryBackend, name: str, step: int, shards: int) -> None:
        self.backend, self.name, self.step, self.shards = backend, name, step, shards

    def shard(self, i: int) -> str:
        return f"{self.name}/shard-{i}"

    def remove_shard(self, i: int) -> SavedCheckpoint:
        """A shard gone missing: a metadata check sees it."""
        self.backend.remove(self.shard(i))
        return self

    def flip_bit(self, i: int, offset: int = 7) -> SavedCheckpoint:
        """A bit flip at rest in shard ``i``: only reading every byte (full) sees it."""
        self.backend.flip(self.shard(i), offset)
        return self

    @property
    def storage_down(self) -> bool:
        return f"{self.name}/" in self.backend.down

    @storage_down.setter
    def storage_down(self, down: bool) -> None:
        (self.backend.down.add if down else self.backend.down.discard)(f"{self.name}/")


class MemoryCheckpointStore:
    """The ``CheckpointStore`` port: ``BackendCheckpointStore`` over a ``MemoryBackend``, with a
    trainer's side (``save``) and a record of every verification asked for (``verified``)."""

    def __init__(self, clock: Clock, root: str = ROOT, *, shards: int = 2, shard_bytes: int = 64) -> None:
        self.clock = clock
        self.backend = MemoryBackend(root, clock)
        self.root = self.backend.root
        self.shards, self.shard_bytes = shards, shard_bytes
        self.verified: list[tuple[str, Level]] = []
        self._store = BackendCheckpointStore(self.backend, workers=2, clock=clock)

    @property
    def listing_down(self) -> bool:
        return self.backend.listing_down

    @listing_down.setter
    def listing_down(self, down: bool) -> None:
        self.backend.listing_down = down

    def save(self, step: int, *, committed: bool = True) -> SavedCheckpoint:
        """Write checkpoint ``step_NNNNNN``: its shards, then (unless ``committed`` is False: a
        torn upload) its manifest, the commit marker."""
        saved = SavedCheckpoint(self.backend, f"step_{step:06d}", step, self.shards)
        entries = []
        for i in range(self.shards):
            data = (f"step {step} shard {i} ".encode() * self.shard_bytes)[: self.shard_bytes]
            self.backend.put(saved.shard(i), data)
            entries.append(ShardEntry(f"shard-{i}", len(data), checksum_of(data)))
        if committed:
            manifest = Manifest(step, tuple(entries))
            self.backend.put(f"{saved.name}/{MANIFEST_NAME}", manifest.to_json().encode())
        return saved

    # -- the CheckpointStore port ---------------------------------------------------------------

    def discover(self) -> list[CheckpointRef]:
        return self._store.discover()

    def verify(self, ref: CheckpointRef, level: Level) -> VerifyResult:
        self.verified.append((ref.name, level))
        return self._store.verify(ref, level)

    def commit(self, name: str, manifest: Manifest) -> str:
        return self._store.commit(name, manifest)
