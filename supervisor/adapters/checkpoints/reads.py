"""The reads behind a checkpoint verification: one verification in progress (its deadline and its
stop flag, shared by the workers) and its parallel storage calls — HEADs, and every object streamed
once through ``Digest`` (memory bounded by ``workers x chunk_size``), optionally under a bandwidth
limit (a token bucket shared by the readers).

The first storage error or the deadline stops every worker; what was left undone is reported as
*why*, never guessed at: the verifier turns it into UNVERIFIABLE unless it found definite damage.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from supervisor.adapters.checkpoints.backend import ObjectBackend, StorageError
from supervisor.adapters.checkpoints.checksums import Digest
from supervisor.adapters.checkpoints.throttle import TokenBucket
from supervisor.domain.checkpoints.manifest import CheckpointRef, ChecksumAlgorithm, Level

log = structlog.get_logger(__name__)


class Stopped(Exception):
    """This verification is over (deadline passed, or another worker hit a storage error)."""


@dataclass
class VerifyRun:
    """One verification in progress: its deadline, its stop flag, what it has read."""

    ref: CheckpointRef
    level: Level
    prefix: str  # the checkpoint's key prefix, relative to the backend's root ("" or "a/b/")
    started: float
    deadline: float | None
    monotonic: Callable[[], float]
    stop: threading.Event = field(default_factory=threading.Event)
    why_stopped: str = ""
    bytes_read: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self) -> None:
        if self.stop.is_set():
            raise Stopped(self.why_stopped)
        if self.deadline is not None and self.monotonic() > self.deadline:
            self.halt("deadline passed")
            raise Stopped(self.why_stopped)

    def halt(self, why: str) -> None:
        with self.lock:
            if not self.stop.is_set():
                self.why_stopped = why
                self.stop.set()

    def remaining(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - self.monotonic())


@dataclass(frozen=True)
class ParallelReads:
    """Storage calls of one backend on ``workers`` threads, for one ``VerifyRun`` at a time."""

    backend: ObjectBackend
    workers: int
    chunk_size: int
    bandwidth_bytes_s: float | None
    read_attempts: int
    monotonic: Callable[[], float]

    def each(
        self, run: VerifyRun, keys: Sequence[str], work: Callable[[str], object]
    ) -> tuple[dict[str, object], str | None]:
        """``work(key)`` for every key on ``workers`` threads. Returns the results and, when some
        keys were left undone (a storage error, the deadline), why."""
        results: dict[str, object] = {}
        errors: list[StorageError] = []
        if not keys:
            return results, None

        def one(key: str) -> None:
            try:
                run.check()
                results[key] = work(key)
            except StorageError as exc:
                errors.append(exc)
                run.halt(f"storage error: {exc}")
            except Stopped:
                pass

        pool = cf.ThreadPoolExecutor(max_workers=min(self.workers, len(keys)), thread_name_prefix="ssv-verify")
        try:
            _, pending = cf.wait([pool.submit(one, k) for k in keys], timeout=run.remaining())
            if pending:
                run.halt("deadline passed")
        finally:
            pool.shutdown(wait=not run.stop.is_set(), cancel_futures=True)
        if errors:
            return results, f"storage error: {errors[0]}"
        if run.stop.is_set():
            return results, run.why_stopped
        return results, None

    def digests(
        self, run: VerifyRun, keys: Sequence[str], algorithm: ChecksumAlgorithm, *, rooted: bool = False
    ) -> tuple[dict[str, tuple[int, str]], list[str], str | None]:
        """Digest every key once. Returns (digests, keys found missing, why some were left unread).
        Keys are relative to the checkpoint's prefix unless ``rooted``."""
        bucket = self._bucket(run)
        missing: list[str] = []

        def one(key: str) -> tuple[int, str] | None:
            try:
                return self._digest(run, key if rooted else run.prefix + key, algorithm, bucket)
            except KeyError:
                missing.append(key)
                return None

        got, failure = self.each(run, keys, one)
        digests = {k: v for k, v in got.items() if isinstance(v, tuple)}
        return digests, missing, failure

    def _bucket(self, run: VerifyRun) -> TokenBucket | None:
        if not self.bandwidth_bytes_s:
            return None
        return TokenBucket(
            self.bandwidth_bytes_s,
            burst_bytes=max(self.chunk_size, self.bandwidth_bytes_s / 4),
            monotonic=self.monotonic,
            wait=run.stop.wait,
        )

    def _digest(
        self, run: VerifyRun, key: str, algorithm: ChecksumAlgorithm, bucket: TokenBucket | None
    ) -> tuple[int, str]:
        """(size, checksum) of one object, read again on a transient error up to ``read_attempts``."""
        for attempt in range(1, self.read_attempts + 1):
            digest = Digest(algorithm)
            try:
                for chunk in self.backend.read(key, self.chunk_size):
                    run.check()
                    if bucket is not None:
                        bucket.take(len(chunk))
                    digest.update(chunk)
                    with run.lock:
                        run.bytes_read += len(chunk)
                return digest.size, digest.value()
            except StorageError as exc:
                if not exc.transient or attempt == self.read_attempts or run.stop.is_set():
                    raise
                log.info("ckpt.read_retry", location=self.backend.location(key), attempt=attempt, error=str(exc))
        raise AssertionError("unreachable")
