"""The storage a checkpoint test runs on (see conftest.py): a root, and ways to damage it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memory_checkpoints import MemoryBackend

from supervisor.adapters.checkpoints.posix import PosixBackend
from supervisor.adapters.checkpoints.s3 import S3Backend
from supervisor.adapters.checkpoints.store import BackendCheckpointStore
from supervisor.testing.servers.s3servers import S3Server


@dataclass
class StoreEnv:
    """One empty checkpoint root on one kind of storage, and ways to damage what is written there."""

    kind: str
    root: str
    server: S3Server | None = None
    bucket: str = ""
    path: Path | None = None
    prefix: str = ""  # S3: the root's key prefix in the bucket
    options: dict[str, Any] = field(default_factory=dict)
    memory: MemoryBackend | None = None  # the tests' in-memory storage (tests/memory_checkpoints.py)

    def backend(self, **s3_options: Any) -> Any:
        if self.memory is not None:
            return self.memory
        if self.server is None:
            return PosixBackend(self.root)
        opts = {
            "endpoint_url": self.server.endpoint_url,
            "region": self.server.region,
            "read_timeout": 10.0,
            "max_attempts": 3,
            **s3_options,
        }
        return S3Backend(self.root, **opts)

    def store(self, *, backend: Any = None, **options: Any) -> BackendCheckpointStore:
        return BackendCheckpointStore(backend if backend is not None else self.backend(), **options)

    def put(self, key: str, data: bytes) -> None:
        """Write an object as a trainer would (S3: asking the server to keep a CRC64NVME)."""
        if self.memory is not None:
            self.memory.put(key, data)
            return
        if self.server is None:
            assert self.path is not None
            target = self.path / key
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            return
        self.server.admin_client().put_object(
            Bucket=self.bucket, Key=self.prefix + key, Body=data, ChecksumAlgorithm="CRC64NVME"
        )

    def remove(self, key: str) -> None:
        if self.memory is not None:
            self.memory.remove(key)
        elif self.server is None:
            assert self.path is not None
            (self.path / key).unlink()
        else:
            self.server.admin_client().delete_object(Bucket=self.bucket, Key=self.prefix + key)

    def flip(self, key: str, offset: int) -> None:
        """Flip one bit of a stored object below the storage's API (its metadata stays)."""
        if self.memory is not None:
            self.memory.flip(key, offset)
        elif self.server is None:
            assert self.path is not None
            with open(self.path / key, "r+b") as f:
                f.seek(offset)
                byte = f.read(1)
                f.seek(offset)
                f.write(bytes([byte[0] ^ 1]))
        else:
            self.server.flip_bit_at_rest(self.bucket, self.prefix + key, offset)

    def truncate_at_rest(self, key: str, size: int) -> None:
        if self.server is None:
            assert self.path is not None
            os.truncate(self.path / key, size)
        else:
            self.server.truncate_at_rest(self.bucket, self.prefix + key, size)
