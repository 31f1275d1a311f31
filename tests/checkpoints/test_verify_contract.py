"""One contract suite for checkpoint verification, run on a POSIX directory, moto and Ceph RGW.

Injected corruption: every kind is caught at *full*; each one that metadata can see is caught at
*metadata*. Damage below the storage's API (a bit flip at rest) is invisible to metadata on every
server (S3-NOTES): those tests assert that too, so a change in what a server reveals shows up here.
"""

from __future__ import annotations

import pytest
from ckpt_env import StoreEnv

from supervisor.adapters.checkpoints.checksums import checksum_of
from supervisor.adapters.checkpoints.commit import build_manifest
from supervisor.domain.checkpoints.manifest import (
    MANIFEST_NAME,
    CheckpointRef,
    Guarantee,
    Level,
    Manifest,
    Outcome,
    ShardEntry,
    VerifyResult,
)
from supervisor.ports import PermanentError
from supervisor.testing.kit.clock import ManualClock

SHARD = 96 * 1024 + 5  # odd size; well under Ceph's 4 MiB head object


def shard_bytes(step: int, i: int, size: int = SHARD) -> bytes:
    return (f"step {step} shard {i} ".encode() * (size // 16 + 1))[:size]


def write_checkpoint(
    env: StoreEnv, step: int, shards: int = 4, *, commit: bool = True, name: str | None = None
) -> tuple[str, Manifest]:
    """Shards as a trainer writes them, then the manifest (computed here, independently), last."""
    name = name or f"step_{step:06d}"
    entries = []
    for i in range(shards):
        data = shard_bytes(step, i)
        env.put(f"{name}/model/shard_{i:03d}.pt", data)
        entries.append(ShardEntry(f"model/shard_{i:03d}.pt", len(data), checksum_of(data)))
    manifest = Manifest(step, tuple(entries))
    if commit:
        env.put(f"{name}/{MANIFEST_NAME}", manifest.to_json().encode())
    return name, manifest


def find(env: StoreEnv, name: str, **store_options: object) -> CheckpointRef:
    refs = {r.name: r for r in env.store(**store_options).discover()}  # type: ignore[arg-type]
    assert name in refs, f"{name} not discovered; found {sorted(refs)}"
    return refs[name]


def both(env: StoreEnv, ref: CheckpointRef, **store_options: object) -> tuple[VerifyResult, VerifyResult]:
    store = env.store(**store_options)  # type: ignore[arg-type]
    return store.verify(ref, Level.METADATA), store.verify(ref, Level.FULL)


def problems(result: VerifyResult) -> set[tuple[str, str]]:
    return {(p.key, p.problem) for p in result.problems}


# ------------------------------------------------------------------------- good checkpoints


def test_a_complete_checkpoint_is_verified_at_both_levels(store_env: StoreEnv) -> None:
    name, manifest = write_checkpoint(store_env, 100)
    ref = find(store_env, name)
    assert ref.committed and ref.step == 100 and ref.guarantee is Guarantee.MANIFEST
    meta, full = both(store_env, ref)
    assert meta.outcome is Outcome.VERIFIED, meta.reason
    assert full.outcome is Outcome.VERIFIED, full.reason
    assert full.bytes == manifest.total_bytes and full.shards == 4
    assert meta.step == full.step == 100


def test_commit_through_the_store_writes_a_manifest_once(store_env: StoreEnv) -> None:
    name, _ = write_checkpoint(store_env, 300, commit=False)
    backend = store_env.backend()
    store = store_env.store(backend=backend)
    manifest = build_manifest(backend, name, 300)
    location = store.commit(name, manifest)
    assert location == backend.location(f"{name}/")
    ref = find(store_env, name)
    assert ref.committed
    assert store.verify(ref, Level.FULL).outcome is Outcome.VERIFIED
    with pytest.raises(PermanentError, match="already has"):
        store.commit(name, manifest)


# ------------------------------------------------------------------------- injected corruption


def test_a_bit_flip_at_rest_is_caught_at_full_only(store_env: StoreEnv) -> None:
    name, _ = write_checkpoint(store_env, 100)
    store_env.flip(f"{name}/model/shard_002.pt", 4097)
    meta, full = both(store_env, find(store_env, name))
    assert meta.outcome is Outcome.VERIFIED, "a bit flip at rest was expected to be invisible to metadata"
    assert full.outcome is Outcome.CORRUPT, full.reason
    assert problems(full) == {("model/shard_002.pt", "checksum")}


def test_a_truncated_shard_is_caught_at_both_levels(store_env: StoreEnv) -> None:
    name, _ = write_checkpoint(store_env, 100)
    store_env.put(f"{name}/model/shard_001.pt", shard_bytes(100, 1)[:5000])  # the writer stopped short
    meta, full = both(store_env, find(store_env, name))
    for result in (meta, full):
        assert result.outcome is Outcome.CORRUPT, result.reason
        assert problems(result) == {("model/shard_001.pt", "size")}


def test_a_shard_of_the_wrong_size_is_caught_at_both_levels(store_env: StoreEnv) -> None:
    name, _ = write_checkpoint(store_env, 100)
    store_env.put(f"{name}/model/shard_003.pt", shard_bytes(100, 3) + b"trailing garbage")
    meta, full = both(store_env, find(store_env, name))
    for result in (meta, full):
        assert result.outcome is Outcome.CORRUPT and problems(result) == {("model/shard_003.pt", "size")}


def test_a_missing_shard_is_caught_at_both_levels(store_env: StoreEnv) -> None:
    name, _ = write_checkpoint(store_env, 100)
    store_env.remove(f"{name}/model/shard_000.pt")
    meta, full = both(store_env, find(store_env, name))
    for result in (meta, full):
        assert result.outcome is Outcome.CORRUPT and problems(result) == {("model/shard_000.pt", "missing")}


def test_a_missing_manifest_is_corrupt_and_rediscovered_as_torn(store_env: StoreEnv) -> None:
    name, _ = write_checkpoint(store_env, 100)
    ref = find(store_env, name)
    store_env.remove(f"{name}/{MANIFEST_NAME}")
    meta, full = both(store_env, ref)  # a reference from before the manifest vanished
    for result in (meta, full):
        assert result.outcome is Outcome.CORRUPT and problems(result) == {(MANIFEST_NAME, "manifest")}
    assert not find(store_env, name).committed


def test_an_unreadable_manifest_is_corrupt(store_env: StoreEnv) -> None:
    name, _ = write_checkpoint(store_env, 100)
    store_env.put(f"{name}/{MANIFEST_NAME}", b'{"format": 1, "step": 100, "shards": [')
    meta, full = both(store_env, find(store_env, name))
    for result in (meta, full):
        assert result.outcome is Outcome.CORRUPT and "not JSON" in result.reason


def test_a_stale_manifest_is_caught_at_both_levels(store_env: StoreEnv) -> None:
    _, old = write_checkpoint(store_env, 100)
    name, _ = write_checkpoint(store_env, 200, commit=False)
    store_env.put(f"{name}/{MANIFEST_NAME}", old.to_json().encode())  # step 100's manifest in step 200
    meta, full = both(store_env, find(store_env, name))
    for result in (meta, full):
        assert result.outcome is Outcome.CORRUPT, result.reason
        assert (MANIFEST_NAME, "stale") in problems(result)
    assert full.outcome is Outcome.CORRUPT and any(p.problem == "checksum" for p in full.problems)


def test_a_torn_upload_is_never_verified(store_env: StoreEnv) -> None:
    name, _ = write_checkpoint(store_env, 100, shards=3, commit=False)
    ref = find(store_env, name)
    assert not ref.committed
    fresh = both(store_env, ref)  # just written: perhaps still uploading
    for result in fresh:
        assert result.outcome is Outcome.UNVERIFIABLE and "commit marker not written yet" in result.reason
    later = ManualClock(max(ref.seen_at, 1.0) + 3 * 3600)
    for result in both(store_env, ref, clock=later):
        assert result.outcome is Outcome.CORRUPT and problems(result) == {(name, "uncommitted")}


def test_a_same_size_foreign_shard_is_caught_at_full(store_env: StoreEnv) -> None:
    """A shard of the same size from another step (sizes repeat between steps): full always
    catches it; metadata only where the server keeps the uploader's CRC64NVME (moto)."""
    name, _ = write_checkpoint(store_env, 100)
    store_env.put(f"{name}/model/shard_001.pt", shard_bytes(999, 1))
    meta, full = both(store_env, find(store_env, name))
    assert full.outcome is Outcome.CORRUPT and problems(full) == {("model/shard_001.pt", "checksum")}
    expected = Outcome.CORRUPT if store_env.kind == "moto" else Outcome.VERIFIED
    assert meta.outcome is expected, meta.reason


def test_truncation_at_rest_is_never_verified(s3_env: StoreEnv) -> None:
    """Bytes cut inside the server while its recorded size stays: moto returns a short body (caught
    as a size mismatch); Ceph's GET stalls after the bytes it has (a read timeout: unverifiable)."""
    name, _ = write_checkpoint(s3_env, 100)
    s3_env.truncate_at_rest(f"{name}/model/shard_002.pt", 4096)
    ref = find(s3_env, name)
    store = s3_env.store(backend=s3_env.backend(read_timeout=1.0, max_attempts=1))
    assert store.verify(ref, Level.METADATA).outcome is Outcome.VERIFIED
    full = store.verify(ref, Level.FULL)
    if s3_env.kind == "moto":
        assert full.outcome is Outcome.CORRUPT and problems(full) == {("model/shard_002.pt", "size")}
    else:
        assert full.outcome is Outcome.UNVERIFIABLE, full.reason


def test_a_bandwidth_limit_slows_full_verification(store_env: StoreEnv) -> None:
    name, manifest = write_checkpoint(store_env, 100, shards=6)
    ref = find(store_env, name)
    total, chunk = manifest.total_bytes, 16 << 10
    rate = total * 2.0  # bytes/s: about half a second, less the bucket's burst (a quarter second)
    result = store_env.store(bandwidth_bytes_s=rate, chunk_size=chunk).verify(ref, Level.FULL)
    assert result.outcome is Outcome.VERIFIED, result.reason
    assert result.seconds >= (total - rate / 4) / rate * 0.9
    slow = store_env.store(bandwidth_bytes_s=total / 4, chunk_size=chunk, deadline_s=0.5).verify(ref, Level.FULL)
    assert slow.outcome is Outcome.UNVERIFIABLE and "deadline" in slow.reason, slow.reason
