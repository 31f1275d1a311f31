"""Shared fixtures. The Slurm ones start a private cluster (supervisor.testing.LocalSlurm).

* ``slurm_cluster``: one cluster for the whole session (started on first use, ~0.2 s), reset
  before every test: controller up, crashed/frozen nodes restarted, every job cancelled, every
  node idle (down/drained ones resumed). Finished jobs stay visible in squeue for MinJobAge
  (300 s): look only at your own job ids.
* ``fresh_slurm``: a cluster of its own for one test (also ~0.2 s), for tests that need an
  untouched controller state.
* ``make_slurm``: a factory for clusters with other settings (``make_slurm(2, extra_conf={...})``),
  each stopped after the test.

When a cluster cannot start here (binaries missing, not root, no writable cgroup2), the test is
skipped, except under ``CI=true``, where it fails with the reason. Tests that use these fixtures
are marked ``slurm`` automatically; mark them explicitly too (``pytestmark = pytest.mark.slurm``).
Set ``LOCALSLURM_KEEP=1`` to keep the clusters' directories (logs) after the run.

* ``postgres``: a fresh, empty database of its own for one test on a private PostgreSQL server
  (``supervisor.testing.servers.postgres``: Debian's binaries under a temporary directory, one server per
  session, started on first use in ~0.6 s; ~0.03 s a database): ``postgres.url`` (no password in
  it), ``postgres.password`` and ``postgres.password_file``, ``postgres.new()`` for another
  database; all dropped after the test. Tests that use it are marked ``postgres`` automatically;
  like the Slurm ones, they skip when the server cannot start here, and fail under ``CI=true``.

* ``demo_state_copy``: ``demo_state_copy(dest, hours=12, crashes=2, seed=7)`` puts a copy of the
  simulated demo run's state directory (``supervisor.sim.demo.run_demo``) at ``dest`` and returns
  it. Each distinct demo is simulated once per session (a 12 h demo takes seconds) and copied per
  use, so a test may change its copy freely.

Helpers that live beside the tests are imported from ``tests/``, which pytest puts on ``sys.path``
for this conftest: ``from unit.sim_world import SimWorld``, ``from memory_checkpoints import ...``;
the shared clock and run spec are the package's (``supervisor.testing.kit.clock``, ``.specs``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.testing import LocalSlurm, LocalSlurmError, unavailable_reason

SLURM_FIXTURES = frozenset({"slurm_cluster", "fresh_slurm", "make_slurm"})
PROMETHEUS_FIXTURES = frozenset({"prometheus_installed", "start_prometheus"})  # tests/prometheus/
POSTGRES_FIXTURES = frozenset({"postgres"})


def _under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


def _cannot_run(reason: str, what: str = "real Slurm") -> None:
    if _under_ci():
        pytest.fail(f"{what} is required under CI=true but cannot run: {reason}", pytrace=False)
    pytest.skip(f"{what} not available: {reason}")


def _keep() -> bool:
    return os.environ.get("LOCALSLURM_KEEP") == "1"


def _start(*args: Any, **kwargs: Any) -> LocalSlurm:
    reason = unavailable_reason()
    if reason:
        _cannot_run(reason)
    kwargs.setdefault("keep_dir", _keep())
    try:
        return LocalSlurm(*args, **kwargs).start()
    except LocalSlurmError as exc:
        _cannot_run(f"LocalSlurm failed to start: {exc}")
        raise  # not reached


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SLURM_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slurm)
        if PROMETHEUS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.prometheus)
        if POSTGRES_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.postgres)


@pytest.fixture(scope="session")
def _slurm_session() -> Iterator[LocalSlurm | str]:
    """The shared cluster, or the reason it could not start (so each test skips/fails alike)."""
    reason = unavailable_reason()
    if reason:
        yield reason
        return
    try:
        cluster = LocalSlurm(keep_dir=_keep()).start()
    except LocalSlurmError as exc:
        yield f"LocalSlurm failed to start: {exc}"
        return
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def slurm_cluster(_slurm_session: LocalSlurm | str) -> LocalSlurm:
    if isinstance(_slurm_session, str):
        _cannot_run(_slurm_session)
    assert isinstance(_slurm_session, LocalSlurm)
    _slurm_session.reset()
    return _slurm_session


@pytest.fixture
def fresh_slurm() -> Iterator[LocalSlurm]:
    cluster = _start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def make_slurm() -> Iterator[Callable[..., LocalSlurm]]:
    started: list[LocalSlurm] = []

    def make(*args: Any, **kwargs: Any) -> LocalSlurm:
        cluster = _start(*args, **kwargs)
        started.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for cluster in started:
            cluster.stop()


@pytest.fixture(scope="session")
def _postgres_session() -> Iterator[Any]:
    """The session's private PostgreSQL server, or the reason it could not start."""
    from supervisor.testing.servers.postgres import LocalPostgres, LocalPostgresError, unavailable_reason

    reason = unavailable_reason()
    if reason:
        yield reason
        return
    try:
        server = LocalPostgres(keep_dir=_keep()).start()
    except LocalPostgresError as exc:
        yield f"LocalPostgres failed to start: {exc}"
        return
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres(_postgres_session: Any) -> Iterator[Any]:
    from supervisor.testing.servers.postgres import Databases

    if isinstance(_postgres_session, str):
        _cannot_run(_postgres_session, "PostgreSQL")
    databases = Databases(_postgres_session)
    try:
        yield databases
    finally:
        databases.drop_all()


@pytest.fixture(scope="session")
def demo_state_copy(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    from supervisor.sim.demo import DemoSettings, run_demo  # here: only sessions that use the demo import it

    pristine: dict[tuple[float, int, int], Path] = {}

    def copy(dest: Path, hours: float = 12, crashes: int = 2, seed: int = 7) -> Path:
        key = (hours, crashes, seed)
        if key not in pristine:
            state = tmp_path_factory.mktemp(f"demo-{hours:g}h-{crashes}-{seed}")
            run_demo(DemoSettings(hours=hours, crashes=crashes, seed=seed), state_dir=str(state))
            pristine[key] = state
        shutil.copytree(pristine[key], dest, dirs_exist_ok=True)
        return Path(dest)

    return copy
