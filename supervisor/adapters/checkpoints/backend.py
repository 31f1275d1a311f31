"""The small object interface both checkpoint stores sit on: S3 (boto3) and POSIX directories.

Keys are relative to the store's root and "/"-separated. The verifier, the discovery of
checkpoints and the commit helper are written once against this interface.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from supervisor.domain.checkpoints.manifest import ChecksumAlgorithm, ObjectInfo


class StorageError(Exception):
    """The storage did not answer usefully: timeout, 5xx, SlowDown, connection reset, refused.

    Never evidence that a checkpoint is corrupt: it makes a verification UNVERIFIABLE.
    ``transient`` says whether trying again later may help (timeouts, 5xx, throttling) or not
    (access denied, no such bucket)."""

    def __init__(self, message: str, *, transient: bool = True) -> None:
        super().__init__(message)
        self.transient = transient


class ObjectBackend(Protocol):
    root: str  # "s3://bucket/prefix/" or "/lustre/run/ckpt"

    def location(self, key: str) -> str:
        """A human- and tool-readable address of ``key``: "s3://bucket/prefix/key" or a path."""
        ...

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object under ``prefix`` (relative), recursively, with size and modification time.
        Listing checksums are filled where the storage returns them. Raises StorageError."""
        ...

    def head(self, key: str, algorithm: ChecksumAlgorithm | None = None) -> ObjectInfo | None:
        """One object's metadata, with its stored checksum for ``algorithm`` when the storage
        keeps one; None when the object does not exist. Raises StorageError."""
        ...

    def read(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """The object's bytes, streamed in chunks (bounded memory). Raises StorageError, also
        part-way through the stream; FileNotFoundError-like absence raises KeyError."""
        ...

    def get_small(self, key: str, max_bytes: int = 16 << 20) -> bytes | None:
        """A small object whole (manifests, tracker files); None when absent. Raises StorageError,
        and ValueError when it is larger than ``max_bytes``."""
        ...

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        """Write a small object. With ``if_absent``: False (nothing written) when it exists, using a
        conditional write where the storage supports one. Raises StorageError."""
        ...
