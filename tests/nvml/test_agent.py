"""The node agent end to end: stand-in NVML → pynvml → agent → HTTP → ingest → findings; the
one-shot check for hooks; the `slurm-supervisor agent` command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.adapters.clock import SystemClock
from supervisor.adapters.nvml import NvmlReader
from supervisor.adapters.web.ingest import IngestServer, ReportIngest
from supervisor.agent import Agent, AgentSettings, HttpSender, check_once
from supervisor.agent.host import read_host
from supervisor.domain.health.findings import NodeFinding, Severity
from supervisor.domain.health.gpu_health import HealthRules
from supervisor.testing.kit.nvml_standin import NvmlStandin

pytestmark = pytest.mark.nvml

TOKEN = "run-token-s3cr3t-0123456789"
CLI = str(Path(sys.executable).parent / "slurm-supervisor")


@pytest.fixture
def ingest() -> Iterator[IngestServer]:
    feed = ReportIngest({"run1": TOKEN}, HealthRules(), SystemClock())
    feed.publish_job_nodes({"run1": frozenset({"gpu007", "gpu011"})})  # run1's job, as the engine says
    srv = IngestServer(feed, port=0)
    srv.start()
    yield srv
    srv.stop()


_SEEN: dict[int, list[NodeFinding]] = {}


def wait_finding(server: IngestServer, rule: str, timeout: float) -> tuple[NodeFinding, float]:
    """The first finding of ``rule`` (drained findings are kept per server for later calls)."""
    seen = _SEEN.setdefault(id(server), [])
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        seen.extend(server.ingest.drain_findings())
        for f in seen:
            if f.rule == rule:
                seen.remove(f)
                return f, time.monotonic() - start
        time.sleep(0.01)
    pytest.fail(f"no {rule} finding within {timeout} s; counters {dict(server.ingest.counters)}")


@pytest.fixture
def running_agent(standin: NvmlStandin, ingest: IngestServer) -> Iterator[Agent]:
    sender = HttpSender(f"http://127.0.0.1:{ingest.port}", "run1", TOKEN, "gpu007")
    agent = Agent("gpu007", NvmlReader(), sender, AgentSettings(interval_s=1.0, xid_poll_s=0.05), host=read_host)
    thread = threading.Thread(target=agent.run)
    thread.start()
    yield agent
    agent.stop()
    thread.join(10)
    assert not thread.is_alive()


def test_xid_reaches_the_daemon_within_a_fraction_of_the_interval(
    standin: NvmlStandin, ingest: IngestServer, running_agent: Agent
) -> None:
    start = time.monotonic()
    while ingest.ingest.counters["reports"] < 1:  # the first sample is in: NVML open, events registered
        assert time.monotonic() - start < 5, "no report from the agent"
        time.sleep(0.01)
    standin.xid(3, 79)
    f, latency = wait_finding(ingest, "xid-79@1", 3.0)
    assert latency < 0.5  # the sample interval is 1 s
    assert (f.node, f.run, f.severity, f.evidence["gpu"]) == ("gpu007", "run1", Severity.FATAL, 3)
    assert "gpu 3, 00000000:79:00.0" in f.reason
    assert set(ingest.ingest.heartbeat_ages(time.time())) == {"gpu007"}


def test_sampled_faults_and_a_lost_gpu_are_reported(
    standin: NvmlStandin, ingest: IngestServer, running_agent: Agent
) -> None:
    standin.gpu(2, remap_pending=1, remap_unc=3)
    standin.gpu(6, lost=1)
    degraded, _ = wait_finding(ingest, "row-remap-pending@1", 4.0)
    assert degraded.severity is Severity.DEGRADED and degraded.evidence["gpu"] == 2
    lost, _ = wait_finding(ingest, "gpu-lost@1", 3.0)
    assert lost.severity is Severity.FATAL and lost.evidence["gpu"] == 6


def test_a_wedged_driver_still_sends_heartbeats(
    standin: NvmlStandin, ingest: IngestServer, running_agent: Agent
) -> None:
    time.sleep(0.3)
    standin.delay(None, "nvmlDeviceGetTemperature", 4000)
    before = ingest.ingest.counters["reports"]
    time.sleep(3.5)
    assert ingest.ingest.counters["reports"] >= before + 2  # heartbeats without GPUs
    assert max(ingest.ingest.heartbeat_ages(time.time()).values()) < 1.6
    standin.clear_failures()


def test_check_once_healthy_fatal_and_hung(standin: NvmlStandin) -> None:
    env = {**os.environ, **standin.env}
    ok = check_once(10.0, node="gpu009", env=env)
    assert ok.error is None and ok.findings == () and ok.report is not None and len(ok.report.gpus) == 8
    standin.gpu(4, ecc_vol_unc=3)
    bad = check_once(10.0, node="gpu009", env=env)
    assert [(f.rule, f.severity, f.source) for f in bad.findings] == [("ecc-uncorrectable@1", Severity.FATAL, "prolog")]
    standin.delay(None, "nvmlDeviceGetCount_v2", 30_000)
    start = time.monotonic()
    hung = check_once(2.0, node="gpu009", env=env)
    assert time.monotonic() - start < 4.0
    assert hung.worst is Severity.FATAL and hung.findings[0].rule == "nvml-hung@1" and hung.report is None


def test_cli_once_exits_2_on_a_fatal_finding(standin: NvmlStandin) -> None:
    env = {**os.environ, **standin.env}
    standin.gpu(1, lost=1)
    done = subprocess.run(
        [CLI, "agent", "--once", "--node", "gpu010", "--timeout", "10"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    out = json.loads(done.stdout)
    assert [f["rule"] for f in out["findings"]] == ["gpu-lost@1"] and out["node"] == "gpu010"


def test_cli_agent_reports_until_sigterm_and_never_logs_the_token(
    standin: NvmlStandin, ingest: IngestServer, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    env = {**os.environ, **standin.env}
    proc = subprocess.Popen(
        [
            CLI,
            "agent",
            "--daemon-url",
            f"http://127.0.0.1:{ingest.port}",
            "--run",
            "run1",
            "--token-file",
            str(token_file),
            "--node",
            "gpu011",
            "--interval",
            "0.5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        start = time.monotonic()
        while ingest.ingest.counters["reports"] < 2:
            assert time.monotonic() - start < 20 and proc.poll() is None, "the agent sent nothing"
            time.sleep(0.05)
        standin.xid(0, 48)
        f, _ = wait_finding(ingest, "xid-48@1", 3.0)
        assert f.node == "gpu011"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 0
    assert TOKEN not in out.decode() and "agent_xid" in out.decode()


def test_cli_agent_without_a_token_says_how_to_give_one(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_SUPERVISOR")}
    done = subprocess.run(
        [CLI, "agent", "--daemon-url", "http://127.0.0.1:1", "--run", "r"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0 and "--token-file" in done.stderr
