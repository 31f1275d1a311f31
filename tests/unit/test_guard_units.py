"""The guard's systemd units: systemd's own tools accept them, the service's exposure stays at or
below 3.0, and the settings its policy depends on stay in place."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from test_systemd_unit import run, systemd_tool, unit_settings

from supervisor.adapters.guard_client import DEFAULT_SOCKET

SYSTEMD = Path(__file__).resolve().parents[2] / "systemd"
SOCKET = SYSTEMD / "slurm-supervisor-guard.socket"
SERVICE = SYSTEMD / "slurm-supervisor-guard.service"


def installable(folder: Path) -> tuple[Path, Path]:
    """Both units side by side, ExecStart pointing at a binary that exists here."""
    script = Path(sys.executable).parent / "slurm-supervisor"
    binary = str(script) if os.access(script, os.X_OK) else "/bin/true"
    service = folder / SERVICE.name
    service.write_text(SERVICE.read_text().replace("ExecStart=/usr/bin/slurm-supervisor", f"ExecStart={binary}", 1))
    socket_unit = folder / SOCKET.name
    socket_unit.write_text(SOCKET.read_text())
    return socket_unit, service


def test_systemd_analyze_verify_finds_nothing(tmp_path: Path) -> None:
    units = installable(tmp_path)
    result = run([systemd_tool("systemd-analyze"), "verify", "--man=no", *map(str, units)])
    complaints = [line for line in (result.stdout + result.stderr).splitlines() if "slurm-supervisor-guard" in line]
    assert result.returncode == 0 and complaints == [], result.stdout + result.stderr


def test_security_exposure_is_at_most_3(tmp_path: Path) -> None:
    tool = systemd_tool("systemd-analyze")
    if "--offline" not in run([tool, "security", "--help"]).stdout:
        pytest.skip("systemd-analyze security --offline needs systemd >= 250")
    _, service = installable(tmp_path)
    result = run([tool, "security", "--offline=true", "--threshold=30", "--no-pager", str(service)])
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert found, result.stdout + result.stderr
    assert float(found.group(1)) <= 3.0, result.stdout


def test_the_settings_the_guard_relies_on() -> None:
    sock = unit_settings(SOCKET.read_text())["Socket"]
    assert sock["ListenStream"] == DEFAULT_SOCKET  # where the client looks by default
    # members of the guard's group ask (least privilege); one guard decides, by UID
    assert (sock["SocketGroup"], sock["SocketMode"], sock["Accept"]) == ("slurm-supervisor-guard", "0660", "no")
    service = unit_settings(SERVICE.read_text())["Service"]
    assert service["ExecStart"] == "/usr/bin/slurm-supervisor guard serve --config /etc/slurm-supervisor/guard.toml"
    # In a user namespace of its own SO_PEERCRED would map every caller to nobody.
    assert "PrivateUsers" not in service and "DynamicUser" not in service
    assert service["StateDirectory"] == "slurm-supervisor-guard" and service["StateDirectoryMode"] == "0700"
    assert service["User"] == "slurm" and service["CapabilityBoundingSet"] == ""
