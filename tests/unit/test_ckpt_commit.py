"""The trainer's commit helper on real directories: manifests built by reading the shards or from
checksums the storage keeps, local files described before upload, and a commit marker written
exactly once."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.adapters.checkpoints.backend import StorageError
from supervisor.adapters.checkpoints.checksums import checksum_of
from supervisor.adapters.checkpoints.commit import (
    AlreadyCommitted,
    build_manifest,
    commit_checkpoint,
    manifest_for_files,
)
from supervisor.adapters.checkpoints.posix import PosixBackend
from supervisor.domain.checkpoints.checks import check_listing
from supervisor.domain.checkpoints.manifest import MANIFEST_NAME, ChecksumAlgorithm, Manifest, ObjectInfo


class KeepsChecksums(PosixBackend):
    """A stateful stand-in for storage that keeps checksums (as S3 does for uploads that asked):
    records each object's checksum at put time and counts the bytes read back."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.stored: dict[str, str] = {}
        self.bytes_read = 0
        self.lock = threading.Lock()

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        ok = super().put(key, data, if_absent=if_absent)
        if ok:
            self.stored[key] = checksum_of(data, ChecksumAlgorithm.CRC64NVME)
        return ok

    def head(self, key: str, algorithm: ChecksumAlgorithm | None = None) -> ObjectInfo | None:
        info = super().head(key, algorithm)
        if info is None or algorithm is not ChecksumAlgorithm.CRC64NVME or key not in self.stored:
            return info
        return ObjectInfo(info.key, info.size, {algorithm.value: self.stored[key]}, None, info.modified_at)

    def read(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        for chunk in super().read(key, chunk_size):
            with self.lock:
                self.bytes_read += len(chunk)
            yield chunk


def shards(backend: PosixBackend, name: str, n: int = 5, size: int = 3000) -> dict[str, bytes]:
    data = {f"{name}/rank{i:02d}/model.pt": os.urandom(size + i) for i in range(n)}
    for key, blob in data.items():
        backend.put(key, blob)
    return data


@pytest.mark.parametrize("algorithm", list(ChecksumAlgorithm))
def test_build_manifest_reads_and_checksums_every_shard(tmp_path: Path, algorithm: ChecksumAlgorithm) -> None:
    backend = PosixBackend(str(tmp_path))
    data = shards(backend, "step_000100")
    manifest = build_manifest(
        backend, "step_000100/", 100, algorithm=algorithm, writer="node7", workers=3, run="run42", clock=lambda: 1234.5
    )
    assert (manifest.step, manifest.algorithm, manifest.created_at, manifest.run) == (100, algorithm, 1234.5, "run42")
    assert [(s.key, s.size, s.checksum, s.writer) for s in manifest.shards] == [
        (k[len("step_000100/") :], len(v), checksum_of(v, algorithm), "node7") for k, v in sorted(data.items())
    ]
    assert all(s.written_at for s in manifest.shards)


def test_stored_checksums_are_used_instead_of_reading(tmp_path: Path) -> None:
    backend = KeepsChecksums(str(tmp_path))
    data = shards(backend, "step_000200")
    manifest = build_manifest(backend, "step_000200", 200)
    assert backend.bytes_read == 0
    assert {s.checksum for s in manifest.shards} == {checksum_of(v) for v in data.values()}
    build_manifest(backend, "step_000200", 200, algorithm=ChecksumAlgorithm.SHA256)  # not kept: read
    assert backend.bytes_read == sum(len(v) for v in data.values())


def test_commit_writes_the_marker_once(tmp_path: Path) -> None:
    backend = PosixBackend(str(tmp_path))
    shards(backend, "step_000300")
    manifest = build_manifest(backend, "step_000300", 300)
    location = commit_checkpoint(backend, "step_000300", manifest)
    assert location == str(tmp_path / "step_000300")
    stored = Manifest.from_json(backend.get_small(f"step_000300/{MANIFEST_NAME}") or b"")
    assert stored == manifest
    listing = {o.key[len("step_000300/") :]: o for o in backend.list("step_000300/")}
    assert check_listing(stored, listing, name="step_000300") == ()
    with pytest.raises(AlreadyCommitted, match="committed once"):
        commit_checkpoint(backend, "step_000300", manifest)
    with pytest.raises(AlreadyCommitted):
        build_manifest(backend, "step_000300", 300)
    assert Manifest.from_json(backend.get_small(f"step_000300/{MANIFEST_NAME}") or b"") == manifest


def test_commit_refuses_a_step_that_contradicts_the_name(tmp_path: Path) -> None:
    backend = PosixBackend(str(tmp_path))
    shards(backend, "step_000400", n=1)
    manifest = build_manifest(backend, "step_000400", 401)
    with pytest.raises(ValueError, match="named for step 400"):
        commit_checkpoint(backend, "step_000400", manifest)
    assert backend.head(f"step_000400/{MANIFEST_NAME}") is None


@pytest.mark.parametrize("name", ["", "/", "../x", "a/../b"])
def test_bad_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="checkpoint name"):
        build_manifest(PosixBackend(str(tmp_path)), name, 1)


def test_empty_checkpoint_and_bad_step(tmp_path: Path) -> None:
    backend = PosixBackend(str(tmp_path))
    with pytest.raises(ValueError, match="holds no shards"):
        build_manifest(backend, "step_1", 1)
    with pytest.raises(ValueError, match="non-negative integer"):
        build_manifest(backend, "step_1", -1)


def test_a_shard_still_growing_is_refused(tmp_path: Path) -> None:
    class Growing(PosixBackend):
        def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
            for o in super().list(prefix):  # the listing was taken before the last write landed
                yield ObjectInfo(o.key, o.size - 1, o.checksums, o.version_id, o.modified_at)

    backend = Growing(str(tmp_path))
    shards(backend, "step_5", n=2)
    with pytest.raises(StorageError, match="changed size"):
        build_manifest(backend, "step_5", 5)


def test_manifest_for_local_files(tmp_path: Path) -> None:
    local = tmp_path / "stage" / "step_000500"
    (local / "model").mkdir(parents=True)
    (local / "model" / "a.pt").write_bytes(b"a" * 100)
    (local / "optim.pt").write_bytes(b"o" * 50)
    whole = manifest_for_files(local, 500, algorithm=ChecksumAlgorithm.CRC32C, clock=lambda: 1.0)
    assert [(s.key, s.size, s.checksum) for s in whole.shards] == [
        ("model/a.pt", 100, checksum_of(b"a" * 100, ChecksumAlgorithm.CRC32C)),
        ("optim.pt", 50, checksum_of(b"o" * 50, ChecksumAlgorithm.CRC32C)),
    ]
    picked = manifest_for_files(
        [local / "optim.pt", local / "model" / "a.pt"],
        500,
        root=local,
        algorithm=ChecksumAlgorithm.CRC32C,
        clock=lambda: 1.0,
    )
    assert picked == whole
    with pytest.raises(ValueError, match="not under"):
        manifest_for_files([tmp_path / "stage" / "x"], 1, root=local)
    with pytest.raises(ValueError, match="not a regular file"):
        manifest_for_files([local / "missing.pt"], 1, root=local)
