"""Checkpoint storage fixtures: the same suite on a POSIX directory, moto, Ceph's RADOS Gateway and
the tests' in-memory storage.

* ``moto_s3`` / ``ceph_rgw``: one server each for the whole session (moto ~0.5 s, Ceph ~13 s),
  started on first use, stopped at the end. When one cannot start here the test is skipped,
  except under ``CI=true``, where it fails with the reason (the tests' rule for real servers).
* ``store_env``: parametrized over ``posix``, ``moto``, ``rgw`` and ``memory``: a fresh root (a
  temporary directory, a new bucket, a dict) with the means to damage what is in it (``flip``,
  ``truncate_at_rest``, ``remove``, ``put``), and ``backend(...)`` / ``store(...)`` factories.
  ``memory`` is ``MemoryBackend`` (tests/memory_checkpoints.py), the storage under the engine
  tests' checkpoint store: the one fake keeps to the contract the real storages keep.
* ``s3_env``: the same for the S3 servers only (the fault-proxy tests).

Tests using an S3 server are marked ``s3`` automatically. ``CEPH_KEEP=1`` keeps Ceph's directory.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from ckpt_env import StoreEnv
from memory_checkpoints import MemoryBackend
from required import started

from supervisor.testing.servers.s3servers import CephRgw, MotoS3, S3Server, session_server
from supervisor.testing.servers.shared_servers import shared_server

S3_KINDS = ("moto", "rgw")


@pytest.fixture(scope="session")
def _moto_session() -> Iterator[S3Server | str]:
    yield from session_server(MotoS3)


@pytest.fixture(scope="session")
def _rgw_session() -> Iterator[S3Server | str]:
    yield from shared_server(CephRgw, keep_dir=os.environ.get("CEPH_KEEP") == "1")  # the one tests/e2e uses too


@pytest.fixture
def moto_s3(_moto_session: S3Server | str) -> S3Server:
    return started(_moto_session, "moto S3 server")


@pytest.fixture
def ceph_rgw(_rgw_session: S3Server | str) -> S3Server:
    return started(_rgw_session, "Ceph RADOS Gateway")


def _s3_env(kind: str, server: S3Server, monkeypatch: pytest.MonkeyPatch) -> StoreEnv:
    for name, value in server.credentials_env().items():
        monkeypatch.setenv(name, value)  # S3Backend takes credentials from boto3's normal chain
    bucket = f"ssv-{uuid.uuid4().hex[:12]}"
    server.create_bucket(bucket)
    return StoreEnv(kind, f"s3://{bucket}/run42/ckpt/", server, bucket, prefix="run42/ckpt/")


@pytest.fixture(params=("posix", *S3_KINDS, "memory"))
def store_env(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StoreEnv:
    kind = request.param
    if kind == "memory":
        backend = MemoryBackend("mem://run42/ckpt/")
        return StoreEnv(kind, backend.root, memory=backend)
    if kind == "posix":
        path = tmp_path / "ckpt"
        path.mkdir()
        return StoreEnv(kind, str(path), path=path)
    server = request.getfixturevalue("moto_s3" if kind == "moto" else "ceph_rgw")
    env = _s3_env(kind, server, monkeypatch)
    env.path = None
    return env


@pytest.fixture(params=S3_KINDS)
def s3_env(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> StoreEnv:
    server = request.getfixturevalue("moto_s3" if request.param == "moto" else "ceph_rgw")
    return _s3_env(request.param, server, monkeypatch)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here not in Path(str(item.fspath)).parents:
            continue  # this hook sees the whole session's items: mark only this folder's
        callspec = getattr(item, "callspec", None)
        params = {v for v in callspec.params.values() if isinstance(v, str)} if callspec is not None else set()
        names = set(getattr(item, "fixturenames", ()))
        if names & {"moto_s3", "ceph_rgw", "s3_env"} or ("store_env" in names and params & set(S3_KINDS)):
            item.add_marker(pytest.mark.s3)
