"""The systemd unit, sysusers and tmpfiles files: systemd's own tools accept them, and the
settings the daemon relies on (Type=notify, the hardening, the state dir) stay in place."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from supervisor.config import DaemonConfig

SYSTEMD = Path(__file__).resolve().parents[2] / "systemd"
UNIT = SYSTEMD / "slurm-supervisor.service"
SYSUSERS = SYSTEMD / "slurm-supervisor.sysusers.conf"
TMPFILES = SYSTEMD / "slurm-supervisor.tmpfiles.conf"


def systemd_tool(name: str) -> str:
    """The tool's path; skipped where systemd is missing, but never under CI=true."""
    found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is missing on CI; install the systemd package")
        pytest.skip(f"{name} is not installed")
    return found


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SYSTEMD_LOG_COLOR": "0", "SYSTEMD_PAGER": "", "LC_ALL": "C"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)


def unit_settings(text: str) -> dict[str, dict[str, str]]:
    """``{section: {key: value}}``; a later assignment of a key wins, as in systemd."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
        else:
            key, _, value = line.partition("=")
            current[key.strip()] = value.strip()
    return sections


def installable_copy(folder: Path, extra: str = "") -> Path:
    """The unit with ExecStart pointing at a binary that exists here, plus ``extra`` lines."""
    script = Path(sys.executable).parent / "slurm-supervisor"
    binary = str(script) if os.access(script, os.X_OK) else "/bin/true"
    text = UNIT.read_text().replace("ExecStart=/usr/bin/slurm-supervisor", f"ExecStart={binary}", 1)
    copy = folder / UNIT.name
    copy.write_text(text.replace("[Service]\n", "[Service]\n" + extra, 1))
    return copy


def verify_complaints(unit: Path) -> list[str]:
    result = run([systemd_tool("systemd-analyze"), "verify", "--man=no", str(unit)])
    output = (result.stdout + result.stderr).splitlines()
    assert result.returncode == 0 or any(UNIT.name in line for line in output), output
    return [line for line in output if UNIT.name in line or "slurm-supervisor" in line]


# --------------------------------------------------------------------------- systemd's verdict


def test_systemd_analyze_verify_finds_nothing(tmp_path: Path) -> None:
    assert verify_complaints(installable_copy(tmp_path)) == []


def test_verify_would_catch_a_mistake(tmp_path: Path) -> None:
    """verify exits 0 on unknown keys; this proves the check above reads its output."""
    complaints = verify_complaints(installable_copy(tmp_path, extra="ProtectHome=sometimes\nNoSuchKey=1\n"))
    assert any("NoSuchKey" in line for line in complaints), complaints
    assert any("protect home" in line.lower() for line in complaints), complaints


def test_security_exposure_stays_low(tmp_path: Path) -> None:
    tool = systemd_tool("systemd-analyze")
    if "--offline" not in run([tool, "security", "--help"]).stdout:
        pytest.skip("systemd-analyze security --offline needs systemd >= 250")
    result = run([tool, "security", "--offline=true", "--threshold=30", "--no-pager", str(installable_copy(tmp_path))])
    summary = [line for line in result.stdout.splitlines() if "Overall exposure" in line]
    assert result.returncode == 0, summary or result.stderr


# --------------------------------------------------------------------------- settings that must not drift

REQUIRED = {
    "Type": "notify",
    "NotifyAccess": "main",
    "ExecStart": "/usr/bin/slurm-supervisor daemon --config /etc/slurm-supervisor/supervisor.toml",
    "Restart": "on-failure",
    "RestartSec": "5",
    "WatchdogSec": "60",
    "TimeoutStopSec": "30",
    "KillMode": "control-group",
    "User": "slurm-supervisor",
    "Group": "slurm-supervisor",
    "StateDirectory": "slurm-supervisor",
    "ConfigurationDirectory": "slurm-supervisor",
    "UMask": "0077",
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "read-only",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
    "RestrictNamespaces": "yes",
    "LockPersonality": "yes",
    "MemoryDenyWriteExecute": "yes",
    "SystemCallArchitectures": "native",
    "SystemCallFilter": "@system-service",
    "CapabilityBoundingSet": "",
}


@pytest.mark.parametrize(("key", "value"), sorted(REQUIRED.items()))
def test_unit_keeps_its_settings(key: str, value: str) -> None:
    service = unit_settings(UNIT.read_text())["Service"]
    assert service.get(key) == value, f"{key}= must stay {value!r}; see the comments in {UNIT.name}"


def test_state_dir_is_writable_and_matches_the_daemon_default() -> None:
    service = unit_settings(UNIT.read_text())["Service"]
    state_dir = DaemonConfig().daemon.state_dir
    assert str(state_dir) in service["ReadWritePaths"].split()
    assert state_dir == Path("/var/lib") / service["StateDirectory"]


def test_config_path_is_in_the_configuration_directory() -> None:
    service = unit_settings(UNIT.read_text())["Service"]
    assert f"/etc/{service['ConfigurationDirectory']}/supervisor.toml" in service["ExecStart"]


def test_nothing_hides_munge_or_home_directories() -> None:
    """Slurm clients need /run/munge; batch scripts often live under /home."""
    service = unit_settings(UNIT.read_text())["Service"]
    for key in ("InaccessiblePaths", "TemporaryFileSystem", "PrivateUsers", "DynamicUser"):
        assert key not in service, f"{key}= would cut the Slurm clients off from munge or the scripts"
    assert service["ProtectHome"] not in ("yes", "tmpfs")
    assert "AF_UNIX" in service["RestrictAddressFamilies"].split()


# --------------------------------------------------------------------------- sysusers and tmpfiles


def test_sysusers_and_tmpfiles_create_user_and_state_dir(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    result = run([systemd_tool("systemd-sysusers"), f"--root={tmp_path}", str(SYSUSERS)])
    assert result.returncode == 0, result.stderr
    entry = next(line for line in (tmp_path / "etc/passwd").read_text().splitlines() if line.startswith("slurm-"))
    name, _, uid, gid, _, home, shell = entry.split(":")
    assert (name, home, shell) == ("slurm-supervisor", "/var/lib/slurm-supervisor", "/usr/sbin/nologin")
    assert "slurm-supervisor:x:" in (tmp_path / "etc/group").read_text()
    if os.geteuid() != 0:
        pytest.skip("systemd-tmpfiles --create must chown, which needs root")
    result = run([systemd_tool("systemd-tmpfiles"), f"--root={tmp_path}", "--create", str(TMPFILES)])
    assert result.returncode == 0, result.stderr
    state = (tmp_path / "var/lib/slurm-supervisor").stat()
    assert (state.st_mode & 0o777, state.st_uid, state.st_gid) == (0o700, int(uid), int(gid))


# --------------------------------------------------------------------------- MemoryDenyWriteExecute

_UNDER_MDWE = textwrap.dedent(
    """
    import ctypes, mmap, sys
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(65, 1, 0, 0, 0) != 0:  # PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN
        sys.exit(ctypes.get_errno())
    try:
        mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        sys.exit("W+X memory was allowed: the guard is not active")
    except OSError:
        pass
    import sqlite3, ssl, subprocess, socket
    import supervisor.config, supervisor.adapters.logging, supervisor.adapters.sdnotify
    from supervisor.adapters.logging import configure_logging
    configure_logging("info", "json")
    supervisor.config.load_daemon_config(None)
    callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(lambda x: x + 1)
    assert callback(41) == 42
    assert subprocess.run([sys.executable, "-c", "pass"]).returncode == 0
    print("ok")
    """
)


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_MDWE is Linux's")
def test_python_and_our_imports_run_without_writable_executable_memory() -> None:
    """What MemoryDenyWriteExecute=yes enforces, applied with prctl (Linux >= 6.3)."""
    result = subprocess.run([sys.executable, "-c", _UNDER_MDWE], capture_output=True, text=True, timeout=60)
    if result.returncode == errno.EINVAL:
        pytest.skip("this kernel has no PR_SET_MDWE (Linux < 6.3)")
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
