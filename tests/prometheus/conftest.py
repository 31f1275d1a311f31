"""Debian's ``prometheus`` and ``promtool`` for the tests of the metrics, the alert rules and the
dashboard against the real thing (supervisor.testing.servers.prometheus).

Missing binaries, or a Prometheus that does not start, skip these tests, except under ``CI=true``,
where they fail with the reason: install them with ``apt-get install -y --no-install-recommends
prometheus`` (scripts/test does).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from supervisor.testing.servers.prometheus import LocalPrometheus, PrometheusError, unavailable_reason


def cannot_run(reason: str) -> None:
    if os.environ.get("CI", "").strip().lower() == "true":
        pytest.fail(f"Prometheus is required under CI=true but cannot run: {reason}", pytrace=False)
    pytest.skip(f"Prometheus not available: {reason}")


@pytest.fixture(scope="session")
def prometheus_installed() -> None:
    """Skips (or, under CI=true, fails) the test when prometheus or promtool is missing."""
    reason = unavailable_reason()
    if reason:
        cannot_run(reason)


@pytest.fixture(scope="session")
def start_prometheus(prometheus_installed: None) -> Callable[[LocalPrometheus], LocalPrometheus]:
    """``start_prometheus(LocalPrometheus(...))``: started, or the test skipped (failed under CI=true)."""

    def start(prometheus: LocalPrometheus) -> LocalPrometheus:
        try:
            return prometheus.start()
        except PrometheusError as exc:
            cannot_run(str(exc))
            raise  # not reached

    return start
