"""End-to-end scenarios: the real daemon, a real Slurm, real PyTorch training (examples/torch/).

* ``torch_ready``: skips the test when torch cannot be imported, except under ``CI=true``, where
  it fails (scripts/test installs the ``torch`` extra).
* ``ceph_rgw``: the harness's Ceph RADOS Gateway (supervisor.testing.servers.s3servers), one for the whole
  test process: tests/checkpoints' fixture gets the same one (supervisor.testing.servers.shared_servers).
  Same rule when it cannot start. ``CEPH_KEEP=1`` keeps Ceph's directory.

Tests here are marked ``slurm`` and ``torch``; those using ``ceph_rgw`` also ``s3``.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from required import cannot_run, started

from supervisor.testing.servers.s3servers import CephRgw, S3Server
from supervisor.testing.servers.shared_servers import shared_server


@pytest.fixture
def torch_ready() -> None:
    if importlib.util.find_spec("torch") is None:
        cannot_run("PyTorch", "torch is not installed (pip install -e '.[torch]')")


@pytest.fixture(scope="session")
def _e2e_rgw_session() -> Iterator[S3Server | str]:
    yield from shared_server(CephRgw, keep_dir=os.environ.get("CEPH_KEEP") == "1")


@pytest.fixture
def ceph_rgw(_e2e_rgw_session: S3Server | str) -> S3Server:
    return started(_e2e_rgw_session, "Ceph RADOS Gateway")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.torch)
            if "ceph_rgw" in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.s3)
