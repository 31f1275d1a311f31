"""``slurm-supervisor agent --once --send``: one check, sent to the daemon's ingest the way the agent
sends (its HttpSender, the run's token, the NodeReport wire format), so the ingest's identity
checks and the daemon's rules apply unchanged; the exit code still says what the check found."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_agent import CLI, TOKEN, wait_finding

from supervisor.adapters.clock import SystemClock
from supervisor.adapters.web.ingest import IngestServer, ReportIngest
from supervisor.domain.health.gpu_health import HealthRules
from supervisor.testing.kit.nvml_standin import NvmlStandin

pytestmark = pytest.mark.nvml


@pytest.fixture
def ingest() -> Iterator[IngestServer]:
    feed = ReportIngest({"run1": TOKEN}, HealthRules(), SystemClock())
    feed.publish_job_nodes({"run1": frozenset({"gpu007"})})  # run1's job, as the engine says
    srv = IngestServer(feed, port=0)
    srv.start()
    yield srv
    srv.stop()


def once_send(ingest: IngestServer, node: str, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [CLI, "agent", "--once", "--send", "--node", node, "--timeout", "10", *extra]
    env = {**env, "SLURM_SUPERVISOR_URL": f"http://127.0.0.1:{ingest.port}", "SLURM_SUPERVISOR_RUN": "run1"}
    return subprocess.run(argv, capture_output=True, text=True, env={**env, "SLURM_SUPERVISOR_TOKEN": TOKEN}, timeout=60, check=False)  # fmt: skip


def test_a_fatal_check_reaches_the_daemon_as_an_agent_report_and_exits_2(
    standin: NvmlStandin, ingest: IngestServer
) -> None:
    standin.gpu(5, lost=1)
    done = once_send(ingest, "gpu007", {**os.environ, **standin.env})
    assert done.returncode == 2, done.stderr
    out = json.loads(done.stdout)
    assert out["sent"] is True and [f["rule"] for f in out["findings"]] == ["gpu-lost@1"]
    found, _ = wait_finding(ingest, "gpu-lost@1", 5.0)  # the daemon's own rules judged the report
    assert (found.node, found.run, found.source) == ("gpu007", "run1", "agent")
    assert ingest.ingest.heartbeat_intervals()["gpu007"] == 0.0  # a single look: no heartbeat promised
    assert TOKEN not in done.stdout + done.stderr


def test_a_node_the_daemon_does_not_know_yet_is_retried_until_it_does(
    standin: NvmlStandin, ingest: IngestServer
) -> None:
    """The daemon hears a run's token only for its job's nodes, as of its last tick: a check run as
    the job starts may come before that tick."""
    feed = ingest.ingest

    def publish_after_a_refusal() -> None:
        while feed.counters["rejected_403"] == 0 and not stop.wait(0.01):
            pass
        feed.publish_job_nodes({"run1": frozenset({"gpu007", "gpu012"})})  # the daemon's next tick

    stop = threading.Event()
    later = threading.Thread(target=publish_after_a_refusal)
    later.start()
    done = once_send(ingest, "gpu012", {**os.environ, **standin.env}, "--send-timeout", "20")
    stop.set()
    later.join()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["sent"] is True
    assert ingest.ingest.counters["rejected_403"] >= 1 and ingest.ingest.counters["reports"] == 1


def test_a_report_the_daemon_refuses_says_so_and_keeps_the_exit_code(
    standin: NvmlStandin, ingest: IngestServer
) -> None:
    standin.gpu(1, lost=1)
    done = once_send(ingest, "gpu099", {**os.environ, **standin.env}, "--send-timeout", "1")
    assert done.returncode == 2  # what the check found, sent or not
    out = json.loads(done.stdout)
    assert out["sent"] is False and "403" in out["send_error"] and "gpu099" in out["send_error"]
    assert "agent_once_not_sent" in done.stderr


def test_send_needs_the_daemon_and_the_run(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_SUPERVISOR")}
    done = subprocess.run(
        [CLI, "agent", "--once", "--send"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.returncode not in (0, 2) and "--daemon-url" in done.stderr
