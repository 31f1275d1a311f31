"""The Slurm hooks as Slurm runs them (the CLI in a child process, environment like slurmd's),
against the stand-in NVML and a real ingest: exit codes, reports, the spool, scontrol's argv,
a wedged driver, and hostile environments."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.adapters.clock import SystemClock
from supervisor.adapters.web.ingest import IngestServer, ReportIngest
from supervisor.adapters.web.tokens import HOOKS
from supervisor.domain.health.findings import Severity
from supervisor.domain.health.gpu_health import HealthRules
from supervisor.testing.kit.nvml_standin import NvmlStandin

pytestmark = pytest.mark.nvml

HOOK_TOKEN = "site-hook-token-0123456789abcdef"


@pytest.fixture
def ingest() -> Iterator[tuple[IngestServer, ReportIngest]]:
    feed = ReportIngest({HOOKS: HOOK_TOKEN}, HealthRules(), SystemClock())
    server = IngestServer(feed, port=0)
    server.start()
    yield server, feed
    server.stop()


@pytest.fixture
def node(standin_library: Path, tmp_path: Path) -> NvmlStandin:
    return NvmlStandin(standin_library, tmp_path / "gpu-node.state")


def hooks_toml(tmp_path: Path, url: str | None, **extra: object) -> Path:
    token = tmp_path / "hook.token"
    token.write_text(HOOK_TOKEN + "\n")
    token.chmod(0o600)
    lines = ["[hooks]", f'spool_dir = "{tmp_path / "spool"}"', f'token_file = "{token}"', "nvml_timeout_s = 3"]
    if url:
        lines.append(f'url = "{url}"')
    lines += [f"{k} = {json.dumps(v)}" for k, v in extra.items()]
    path = tmp_path / "hooks.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def hook(kind: str, config: Path, node: NvmlStandin, **env: str) -> tuple[int, dict, float]:
    full = {"PATH": os.environ["PATH"], "SLURMD_NODENAME": "gpu017", "SLURM_JOB_ID": "4242", **node.env, **env}
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "supervisor", "hook", kind, "--config", str(config)],
        env=full,
        capture_output=True,
        text=True,
        timeout=30,
    )
    took = time.monotonic() - start
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    return done.returncode, lines[-1], took


def test_a_healthy_node_passes_the_prolog_in_under_five_seconds_and_reports(ingest, node, tmp_path):
    server, feed = ingest
    rc, out, took = hook("prolog", hooks_toml(tmp_path, f"http://127.0.0.1:{server.port}"), node)
    assert rc == 0 and out["findings"] == [] and out["sent"] == 1 and took < 5.0, (out, took)
    assert feed.heartbeat_intervals()["gpu017"] == 0.0  # heard; a hook promises no heartbeat
    assert "gpu017" not in feed.heartbeat_ages(time.time())  # so it is never judged a silent agent


def test_a_gpu_off_the_bus_fails_the_prolog_and_the_daemon_hears_of_it(ingest, node, tmp_path):
    server, feed = ingest
    node.gpu(3, lost=1)
    rc, out, _ = hook("prolog", hooks_toml(tmp_path, f"http://127.0.0.1:{server.port}"), node)
    assert rc == 1 and out["exit_code"] == 1
    assert any(f["severity"] == "fatal" for f in out["findings"]), out
    findings = feed.drain_findings()
    assert any(f.node == "gpu017" and f.severity is Severity.FATAL and f.source == "prolog" for f in findings)


def test_a_wedged_driver_cannot_hang_the_prolog(ingest, node, tmp_path):
    server, _ = ingest
    node.delay(None, "nvmlDeviceGetHandleByIndex_v2", 60_000)
    rc, out, took = hook("prolog", hooks_toml(tmp_path, f"http://127.0.0.1:{server.port}"), node)
    assert rc == 1 and took < 6.0, took
    assert any("nvml-hung" in f["rule"] for f in out["findings"])


def test_reports_spool_while_the_daemon_is_away_and_go_first_when_it_is_back(ingest, node, tmp_path):
    server, feed = ingest
    node.gpu(2, lost=1)
    rc, out, _ = hook("epilog", hooks_toml(tmp_path, "http://127.0.0.1:9"), node)  # nothing listens there
    assert rc == 1 and out["spooled"] == 1 and out["sent"] == 0
    assert len(list((tmp_path / "spool").glob("*.json"))) == 1
    node.gpu(2, lost=0)
    rc, out, _ = hook("epilog", hooks_toml(tmp_path, f"http://127.0.0.1:{server.port}"), node)
    assert rc == 0 and out["sent"] == 2 and list((tmp_path / "spool").glob("*.json")) == []
    assert any(f.severity is Severity.FATAL and f.source == "epilog" for f in feed.drain_findings())


def test_the_healthcheck_drains_through_scontrol_with_an_argv(node, tmp_path):
    calls = tmp_path / "scontrol.calls"
    fake = tmp_path / "scontrol"
    fake.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > "{calls}"\n')
    fake.chmod(0o755)
    node.gpu(5, lost=1)
    rc, out, _ = hook("healthcheck", hooks_toml(tmp_path, None, scontrol=str(fake)), node)
    assert rc == 0 and out["drained"]  # Slurm ignores a HealthCheckProgram's exit status
    argv = calls.read_text().splitlines()
    assert argv[:3] == ["update", "nodename=gpu017", "state=drain"]
    assert argv[3].startswith("reason=slurm-supervisor healthcheck: ") and len(argv) == 4


@pytest.mark.parametrize(
    "env",
    [
        {"SLURMD_NODENAME": "gpu017; touch /tmp/pwned"},
        {"SLURMD_NODENAME": "$(touch /tmp/pwned)"},
        {"SLURM_JOB_ID": "1; rm -rf /", "SLURM_JOB_NAME": "\x1b[31m$(reboot)\n", "SLURM_JOB_EXIT_CODE": "`id`"},
    ],
)
def test_hostile_job_environments_reach_no_shell_and_never_fail_the_node(node, tmp_path, env):
    marker = Path("/tmp/pwned")
    marker.unlink(missing_ok=True)
    rc, out, _ = hook("prolog", hooks_toml(tmp_path, None), node, **env)
    assert rc == 0 and not marker.exists()
    text = json.dumps(out)
    assert "\x1b" not in text and "reboot" not in text
    if "SLURMD_NODENAME" in env:
        assert "does not look like a host name" in out["error"]
