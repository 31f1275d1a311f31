"""The CheckpointStore port on an ObjectBackend: discover, verify, commit — S3 or POSIX alike.

``open_store("s3://bucket/run42/ckpt/", endpoint_url=...)`` or ``open_store("/lustre/run42/ckpt")``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from supervisor.adapters.checkpoints.backend import ObjectBackend, StorageError
from supervisor.adapters.checkpoints.commit import AlreadyCommitted, commit_checkpoint
from supervisor.adapters.checkpoints.posix import PosixBackend
from supervisor.adapters.checkpoints.s3 import S3Backend
from supervisor.adapters.checkpoints.verify import DEFAULT_GRACE_S, Verifier
from supervisor.adapters.clock import SystemClock
from supervisor.domain.checkpoints.layouts import discover, wanted_texts
from supervisor.domain.checkpoints.manifest import CheckpointRef, Level, Manifest, VerifyResult
from supervisor.domain.run import Trust
from supervisor.ports import Clock, PermanentError, PortError, TransientError

S3_OPTIONS = frozenset(
    {
        "endpoint_url",
        "region",
        "client",
        "connect_timeout",
        "read_timeout",
        "max_attempts",
        "retry_mode",
        "max_pool_connections",
        "addressing_style",
    }
)


def port_error(exc: StorageError, what: str) -> PortError:
    if exc.transient:
        return TransientError(f"{what}: {exc}", delay=5.0)
    return PermanentError(f"{what}: {exc}")


class BackendCheckpointStore:
    """ports.CheckpointStore over one backend. ``verify`` never raises for storage trouble."""

    def __init__(
        self,
        backend: ObjectBackend,
        *,
        workers: int = 8,
        bandwidth_bytes_s: float | None = None,
        deadline_s: float | None = 6 * 3600.0,
        uncommitted_grace_s: float = DEFAULT_GRACE_S,
        chunk_size: int = 4 << 20,
        clock: Clock | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        key: bytes | None = None,
        trust: Trust = Trust.OWNER,
    ) -> None:
        self.backend = backend
        self.root = backend.root
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.verifier = Verifier(
            backend,
            clock=self.clock,
            workers=workers,
            chunk_size=chunk_size,
            bandwidth_bytes_s=bandwidth_bytes_s,
            deadline_s=deadline_s,
            uncommitted_grace_s=uncommitted_grace_s,
            monotonic=monotonic,
            key=key,
            trust=trust,
        )
        self.key = key

    def discover(self) -> list[CheckpointRef]:
        try:
            objects = list(self.backend.list(""))
            texts = {}
            for key in wanted_texts(objects):
                raw = self.backend.get_small(key, max_bytes=4096)
                if raw is not None:
                    texts[key] = raw.decode("utf-8", errors="replace")
        except StorageError as exc:
            raise port_error(exc, f"listing checkpoints under {self.root}") from exc
        except ValueError:
            texts = {}  # a tracker file too large to be one: judge by modification times
        return discover(objects, self.backend.location, texts)

    def verify(self, ref: CheckpointRef, level: Level) -> VerifyResult:
        return self.verifier.verify(ref, level)

    def commit(self, name: str, manifest: Manifest) -> str:
        try:
            return commit_checkpoint(self.backend, name, manifest, key=self.key)
        except AlreadyCommitted as exc:
            raise PermanentError(str(exc)) from exc
        except StorageError as exc:
            raise port_error(exc, f"committing {name} under {self.root}") from exc


def open_store(
    root: str,
    *,
    workers: int = 8,
    bandwidth_bytes_s: float | None = None,
    deadline_s: float | None = 6 * 3600.0,
    uncommitted_grace_s: float = DEFAULT_GRACE_S,
    clock: Clock | None = None,
    key: bytes | None = None,
    trust: Trust = Trust.OWNER,
    **s3_options: Any,
) -> BackendCheckpointStore:
    """The store for ``root``: ``s3://BUCKET/PREFIX/`` (S3Backend; ``s3_options`` are its keyword
    arguments: endpoint_url, region, timeouts, retries) or a filesystem path (PosixBackend).
    ``key``: the run's manifest key (its manifests are signed and checked with it); ``trust``: the
    run's ``[checkpoints] trust`` (domain.checkpoints.signing)."""
    return BackendCheckpointStore(
        _backend(root, s3_options),
        workers=workers,
        bandwidth_bytes_s=bandwidth_bytes_s,
        deadline_s=deadline_s,
        uncommitted_grace_s=uncommitted_grace_s,
        clock=clock,
        key=key,
        trust=trust,
    )


def _backend(root: str, s3_options: dict[str, Any]) -> ObjectBackend:
    """S3 for ``s3://`` roots, the filesystem for paths; a ValueError names what does not fit."""
    unknown = set(s3_options) - S3_OPTIONS
    if unknown:
        raise ValueError(
            f"unknown checkpoint store option(s) {', '.join(sorted(unknown))}; "
            f"S3 options are {', '.join(sorted(S3_OPTIONS))}"
        )
    if root.startswith("s3://"):
        return S3Backend(root, **s3_options)
    if "://" in root:
        scheme = root.split("://", 1)[0]
        raise ValueError(
            f"checkpoint root {root!r}: scheme {scheme}:// is not supported; use s3://BUCKET/PREFIX/ "
            "for S3-compatible storage (endpoint_url for Ceph, MinIO...) or a filesystem path "
            "(Lustre, GPFS, NFS)"
        )
    if s3_options:
        raise ValueError(
            f"checkpoint root {root!r} is a filesystem path, but S3 options were given "
            f"({', '.join(sorted(s3_options))}): drop them, or write the root as s3://BUCKET/PREFIX/"
        )
    return PosixBackend(root)
