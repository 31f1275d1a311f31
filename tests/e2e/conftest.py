"""End-to-end scenarios: the real daemon, a real Slurm, real PyTorch training (examples/torch/).

* ``torch_ready``: skips the test when torch cannot be imported, except under ``CI=true``, where
  it fails (scripts/test installs the ``torch`` extra).
* ``moto_s3``: one moto S3 server for the session (supervisor.testing.s3servers), same rule.

Tests here are marked ``slurm`` and ``torch``; those using ``moto_s3`` also ``s3``.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.testing.s3servers import MotoS3, S3Server, session_server


def _cannot_run(what: str, reason: str) -> None:
    if os.environ.get("CI", "").strip().lower() == "true":
        pytest.fail(f"{what} is required under CI=true but cannot run: {reason}", pytrace=False)
    pytest.skip(f"{what} not available: {reason}")


@pytest.fixture
def torch_ready() -> None:
    if importlib.util.find_spec("torch") is None:
        _cannot_run("PyTorch", "torch is not installed (pip install -e '.[torch]')")


@pytest.fixture(scope="session")
def _moto_session() -> Iterator[S3Server | str]:
    yield from session_server(MotoS3)


@pytest.fixture
def moto_s3(_moto_session: S3Server | str) -> S3Server:
    if isinstance(_moto_session, str):
        _cannot_run("moto S3 server", _moto_session)
    assert isinstance(_moto_session, S3Server)
    return _moto_session


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.torch)
            if "moto_s3" in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.s3)
