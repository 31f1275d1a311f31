"""Storage faults between the verifier and a real S3 server (moto, Ceph RGW), injected by a proxy:
throttling, 5xx, timeouts, connection resets. None of them may ever make a checkpoint CORRUPT."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ckpt_env import StoreEnv
from test_verify_contract import find, problems, write_checkpoint

from supervisor.adapters.checkpoints.backend import StorageError
from supervisor.domain.checkpoints.manifest import MANIFEST_NAME, Level, Outcome
from supervisor.ports import TransientError
from supervisor.testing.servers.faultproxy import Fault, FaultProxy

pytestmark = pytest.mark.s3

FAULTS = {
    "slowdown": Fault("slowdown"),
    "internal-error": Fault("error", status=500, code="InternalError"),
    "timeout": Fault("delay", delay_s=1.5),
    "reset": Fault("reset"),
    "reset-mid-body": Fault("reset_mid_body", after_bytes=1000),
}


@pytest.fixture
def proxy(s3_env: StoreEnv) -> Iterator[FaultProxy]:
    assert s3_env.server is not None
    with FaultProxy(s3_env.server.endpoint_url) as p:
        yield p


def via(env: StoreEnv, proxy: FaultProxy, **options: object):  # type: ignore[no-untyped-def]
    backend = env.backend(endpoint_url=proxy.url, read_timeout=0.5, connect_timeout=1.0, max_attempts=2)
    return env.store(backend=backend, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("level", list(Level))
@pytest.mark.parametrize("fault", list(FAULTS))
def test_no_storage_fault_makes_a_good_checkpoint_corrupt(
    s3_env: StoreEnv, proxy: FaultProxy, fault: str, level: Level
) -> None:
    name, _ = write_checkpoint(s3_env, 100, shards=3)
    ref = find(s3_env, name)
    template = FAULTS[fault]
    proxy.add(
        Fault(
            template.kind,
            path_contains="/model/shard_001",
            delay_s=template.delay_s,
            after_bytes=template.after_bytes,
            status=template.status,
            code=template.code,
        )
    )
    result = via(s3_env, proxy).verify(ref, level)
    assert result.outcome is not Outcome.CORRUPT, result.reason
    # a HEAD has no body to cut: its answer arrived whole and metadata may verify
    complete = fault == "reset-mid-body" and level is Level.METADATA
    assert result.outcome is (Outcome.VERIFIED if complete else Outcome.UNVERIFIABLE), result.reason
    assert sum(r.hits for r in proxy.rules) >= 1, "the fault was never injected"


def test_throttling_that_stops_is_retried_and_verifies(s3_env: StoreEnv, proxy: FaultProxy) -> None:
    name, _ = write_checkpoint(s3_env, 100, shards=3)
    ref = find(s3_env, name)
    rule = proxy.add(Fault("slowdown", method="GET", path_contains="/model/", times=1))
    result = via(s3_env, proxy).verify(ref, Level.FULL)
    assert result.outcome is Outcome.VERIFIED, result.reason
    assert rule.hits == 1


def test_a_reset_mid_body_once_is_read_again_and_verifies(s3_env: StoreEnv, proxy: FaultProxy) -> None:
    name, _ = write_checkpoint(s3_env, 100, shards=3)
    ref = find(s3_env, name)
    rule = proxy.add(Fault("reset_mid_body", method="GET", path_contains="/model/shard_002", after_bytes=5000, times=1))
    result = via(s3_env, proxy).verify(ref, Level.FULL)
    assert result.outcome is Outcome.VERIFIED, result.reason
    assert rule.hits == 1


def test_damage_found_beside_a_storage_fault_is_still_corrupt(s3_env: StoreEnv, proxy: FaultProxy) -> None:
    name, _ = write_checkpoint(s3_env, 100, shards=3)
    s3_env.remove(f"{name}/model/shard_000.pt")
    ref = find(s3_env, name)
    proxy.add(Fault("slowdown", path_contains="/model/shard_002"))
    for level in Level:
        result = via(s3_env, proxy).verify(ref, level)
        assert result.outcome is Outcome.CORRUPT and problems(result) == {("model/shard_000.pt", "missing")}


def test_an_unreachable_manifest_is_unverifiable_not_missing(s3_env: StoreEnv, proxy: FaultProxy) -> None:
    name, _ = write_checkpoint(s3_env, 100, shards=2)
    ref = find(s3_env, name)
    proxy.add(Fault("reset", path_contains=MANIFEST_NAME))
    for level in Level:
        assert via(s3_env, proxy).verify(ref, level).outcome is Outcome.UNVERIFIABLE


def test_a_failed_listing_makes_discovery_transient(s3_env: StoreEnv, proxy: FaultProxy) -> None:
    write_checkpoint(s3_env, 100, shards=2)
    proxy.add(Fault("slowdown", method="GET", path_contains="list-type=2"))
    with pytest.raises(TransientError, match="SlowDown"):
        via(s3_env, proxy).discover()


def test_access_denied_is_a_permanent_storage_error(s3_env: StoreEnv, proxy: FaultProxy) -> None:
    name, _ = write_checkpoint(s3_env, 100, shards=1)
    proxy.add(Fault("error", method="HEAD", status=403, code="AccessDenied"))
    backend = s3_env.backend(endpoint_url=proxy.url, max_attempts=2)
    with pytest.raises(StorageError) as caught:
        backend.head(f"{name}/model/shard_000.pt")
    assert caught.value.transient is False
    assert proxy.rules[0].hits == 1, "a refused request must not be retried"
