"""Verifier, backend and store pieces that need no server: bandwidth bucket, error mapping, root
parsing, store selection, deadlines, adopted layouts (on a POSIX directory)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from botocore.exceptions import ClientError, ConnectTimeoutError, NoCredentialsError

from supervisor.adapters.checkpoints.backend import StorageError
from supervisor.adapters.checkpoints.posix import PosixBackend
from supervisor.adapters.checkpoints.s3 import S3Backend, parse_s3_root, storage_error
from supervisor.adapters.checkpoints.store import BackendCheckpointStore, open_store
from supervisor.adapters.checkpoints.throttle import TokenBucket
from supervisor.adapters.checkpoints.verify import relative_prefix
from supervisor.domain.checkpoints.manifest import Guarantee, Level, Outcome
from supervisor.testing.kit.clock import ManualClock


def test_the_token_bucket_holds_readers_to_the_rate() -> None:
    fake = ManualClock(100.0)
    bucket = TokenBucket(1000.0, burst_bytes=500, monotonic=fake.now, wait=fake.wait)
    for _ in range(10):
        bucket.take(250)
    # 2,500 bytes at 1,000 B/s with 500 of burst: 2 s of waiting, however it is split
    assert sum(fake.waits) == pytest.approx(2.0)
    fake.advance(10.0)  # idle: the bucket refills to its burst, no more
    bucket.take(500)
    assert sum(fake.waits) == pytest.approx(2.0)
    bucket.take(100)
    assert sum(fake.waits) == pytest.approx(2.1)


def test_a_zero_bandwidth_limit_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="leave it unset"):
        TokenBucket(0, monotonic=lambda: 0.0, wait=lambda s: None)


def _client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject"
    )


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (_client_error("SlowDown", 503), True),
        (_client_error("InternalError", 500), True),
        (_client_error("RequestTimeout", 400), True),
        (_client_error("AccessDenied", 403), False),
        (_client_error("NoSuchBucket", 404), False),
        (_client_error("InvalidAccessKeyId", 403), False),
        (ConnectTimeoutError(endpoint_url="http://x"), True),
        (ConnectionResetError(104, "reset"), True),
        (NoCredentialsError(), False),
    ],
)
def test_storage_errors_are_classified(exc: BaseException, transient: bool) -> None:
    err = storage_error(exc, "GET s3://b/k")
    assert isinstance(err, StorageError) and err.transient is transient
    assert "GET s3://b/k" in str(err)


@pytest.mark.parametrize(
    ("root", "bucket", "prefix"),
    [
        ("s3://b-1/run/ckpt", "b-1", "run/ckpt/"),
        ("s3://b-1/run/ckpt/", "b-1", "run/ckpt/"),
        ("s3://b-1", "b-1", ""),
    ],
)
def test_s3_roots_are_parsed(root: str, bucket: str, prefix: str) -> None:
    assert parse_s3_root(root) == (bucket, prefix)


@pytest.mark.parametrize(
    ("root", "message"), [("s3://", "names no valid bucket"), ("b/x", "does not start with s3://")]
)
def test_bad_s3_roots_name_the_fix(root: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_s3_root(root)


def test_s3_backend_refuses_unbounded_waits() -> None:
    with pytest.raises(ValueError, match="no unbounded waits"):
        S3Backend("s3://bucket/x", read_timeout=0)


def test_open_store_picks_the_backend_and_names_the_fix(tmp_path: Path) -> None:
    assert isinstance(open_store(str(tmp_path)).backend, PosixBackend)
    s3 = open_store("s3://bucket/run/", endpoint_url="http://127.0.0.1:1", region="us-east-1")
    assert isinstance(s3.backend, S3Backend) and s3.root == "s3://bucket/run/"
    with pytest.raises(ValueError, match="s3://BUCKET/PREFIX/"):
        open_store("gs://bucket/run")
    with pytest.raises(ValueError, match="drop them"):
        open_store(str(tmp_path), endpoint_url="http://127.0.0.1:1")
    with pytest.raises(ValueError, match="unknown checkpoint store option"):
        open_store("s3://bucket/run/", endpont_url="http://x")


def test_relative_prefix_of_locations(tmp_path: Path) -> None:
    posix = PosixBackend(str(tmp_path))
    assert relative_prefix(posix, posix.location("a/step_1/")) == "a/step_1/"
    s3 = S3Backend("s3://bucket/run/", endpoint_url="http://127.0.0.1:1", region="us-east-1")
    assert relative_prefix(s3, "s3://bucket/run/step_1/") == "step_1/"
    with pytest.raises(ValueError, match="not under the store's root"):
        relative_prefix(s3, "s3://other/run/step_1/")


class StallingBackend(PosixBackend):
    """A POSIX backend whose reads stall until released: a hung file server."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.release = threading.Event()

    def read(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        self.release.wait(10.0)
        return super().read(key, chunk_size)


def test_a_hung_read_hits_the_deadline_and_is_unverifiable(tmp_path: Path) -> None:
    from ckpt_env import StoreEnv
    from test_verify_contract import find, write_checkpoint

    env = StoreEnv("posix", str(tmp_path), path=tmp_path)
    name, _ = write_checkpoint(env, 100, shards=2)
    backend = StallingBackend(str(tmp_path))
    try:
        store = BackendCheckpointStore(backend, deadline_s=0.3)
        result = store.verify(find(env, name), Level.FULL)
    finally:
        backend.release.set()
    assert result.outcome is Outcome.UNVERIFIABLE and "deadline" in result.reason
    assert store.verify(find(env, name), Level.METADATA).outcome is Outcome.VERIFIED


def _dcp(root: Path, name: str, *, metadata: bool = True, empty_shard: bool = False) -> None:
    d = root / name
    d.mkdir(parents=True)
    (d / "__0_0.distcp").write_bytes(b"" if empty_shard else b"x" * 1000)
    (d / "__1_0.distcp").write_bytes(b"y" * 1000)
    if metadata:
        (d / ".metadata").write_bytes(b"pickled plan")


def test_adopted_dcp_checkpoints_carry_their_weak_guarantee(tmp_path: Path) -> None:
    _dcp(tmp_path, "step_100")
    _dcp(tmp_path, "step_200", empty_shard=True)
    _dcp(tmp_path, "step_300", metadata=False)
    store = BackendCheckpointStore(PosixBackend(str(tmp_path)))
    refs = {r.name: r for r in store.discover()}
    assert {r.guarantee for r in refs.values()} == {Guarantee.DCP}
    for level in Level:
        good = store.verify(refs["step_100"], level)
        assert good.outcome is Outcome.VERIFIED and good.guarantee is Guarantee.DCP and "weak" in good.reason
        assert store.verify(refs["step_200"], level).outcome is Outcome.CORRUPT
        assert store.verify(refs["step_300"], level).outcome is Outcome.UNVERIFIABLE  # uploading, maybe
    later = BackendCheckpointStore(PosixBackend(str(tmp_path)), clock=ManualClock(refs["step_300"].seen_at + 86400))
    torn = later.verify(refs["step_300"], Level.FULL)
    assert torn.outcome is Outcome.CORRUPT and torn.problems[0].problem == "uncommitted"
    assert store.verify(refs["step_100"], Level.FULL).bytes == 2000 + len(b"pickled plan")
