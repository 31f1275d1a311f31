"""The systemd units (the per-account template, the user unit), sysusers and tmpfiles: systemd's own
tools accept them, the template's exposure stays at most 2.0, and the settings the daemon relies on
(Type=notify, one account and one set of folders per instance, the hardening, the limits) stay."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from supervisor.config import DaemonConfig

SYSTEMD = Path(__file__).resolve().parents[2] / "systemd"
TEMPLATE = SYSTEMD / "slurm-supervisor@.service"
USER_UNIT = SYSTEMD / "user" / "slurm-supervisor.service"
SYSUSERS = SYSTEMD / "slurm-supervisor.sysusers.conf"
TMPFILES = SYSTEMD / "slurm-supervisor.tmpfiles.conf"
MAX_EXPOSURE = 2.0  # systemd-analyze security, the template (issue 13, issue 17)


def systemd_tool(name: str) -> str:
    """The tool's path; skipped where systemd is missing, but never under CI=true."""
    found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is missing on CI; install the systemd package")
        pytest.skip(f"{name} is not installed")
    return found


def run(argv: list[str], extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SYSTEMD_LOG_COLOR": "0", "SYSTEMD_PAGER": "", "LC_ALL": "C", **(extra_env or {})}
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


def service(unit: Path) -> dict[str, str]:
    return unit_settings(unit.read_text())["Service"]


def installable_copy(unit: Path, folder: Path, extra: str = "") -> Path:
    """The unit with ExecStart pointing at a binary that exists here, plus ``extra`` lines."""
    script = Path(sys.executable).parent / "slurm-supervisor"
    binary = str(script) if os.access(script, os.X_OK) else "/bin/true"
    text = unit.read_text().replace("ExecStart=/usr/bin/slurm-supervisor", f"ExecStart={binary}", 1)
    copy = folder / unit.name
    copy.write_text(text.replace("[Service]\n", "[Service]\n" + extra, 1))
    return copy


def verify_complaints(unit: Path, folder: Path) -> list[str]:
    """What ``systemd-analyze verify`` says about the unit (a user unit is checked as one)."""
    user = unit.parent.name == "user" or folder.name == "user"
    argv = [systemd_tool("systemd-analyze"), "verify", "--man=no", *(["--user"] if user else [])]
    runtime = folder / "xdg-runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    result = run([*argv, str(unit)], {"XDG_RUNTIME_DIR": str(runtime)})
    output = (result.stdout + result.stderr).splitlines()
    assert result.returncode == 0 or any(unit.name in line for line in output), output
    return [line for line in output if unit.name in line or "slurm-supervisor" in line]


def exposure(unit: Path) -> float:
    tool = systemd_tool("systemd-analyze")
    if "--offline" not in run([tool, "security", "--help"]).stdout:
        if os.environ.get("CI") == "true":
            pytest.fail("systemd-analyze security --offline needs systemd >= 250; CI has Debian 12's 252")
        pytest.skip("systemd-analyze security --offline needs systemd >= 250")
    result = run([tool, "security", "--offline=true", "--threshold=100", "--no-pager", str(unit)])
    summary = [line for line in result.stdout.splitlines() if "Overall exposure" in line]
    assert result.returncode == 0 and summary, result.stdout + result.stderr
    return float(re.search(r": (\d+\.\d+)", summary[0]).group(1))  # type: ignore[union-attr]


# --------------------------------------------------------------------------- systemd's verdict


@pytest.mark.parametrize("unit", [TEMPLATE, USER_UNIT], ids=["template", "user"])
def test_systemd_analyze_verify_finds_nothing(tmp_path: Path, unit: Path) -> None:
    folder = tmp_path / unit.parent.name
    folder.mkdir()
    assert verify_complaints(installable_copy(unit, folder), folder) == []


def test_verify_would_catch_a_mistake(tmp_path: Path) -> None:
    """verify exits 0 on unknown keys; this proves the check above reads its output."""
    complaints = verify_complaints(
        installable_copy(TEMPLATE, tmp_path, "ProtectHome=sometimes\nNoSuchKey=1\n"), tmp_path
    )
    assert any("NoSuchKey" in line for line in complaints), complaints
    # systemd 252 (Debian 12) says "Failed to parse protect home value", 257 (Debian 13) "Failed to parse ProtectHome="
    assert any("protecthome" in line.lower().replace(" ", "") for line in complaints), complaints


def test_the_templates_exposure_is_at_most_two(tmp_path: Path) -> None:
    figure = exposure(installable_copy(TEMPLATE, tmp_path))
    print(f"systemd-analyze security --offline=true {TEMPLATE.name}: {figure}")
    assert figure <= MAX_EXPOSURE


# --------------------------------------------------------------------------- settings that must not drift

REQUIRED = {
    "Type": "notify",
    "NotifyAccess": "main",
    "ExecStart": "/usr/bin/slurm-supervisor daemon --config /etc/slurm-supervisor/%i.toml",
    "Restart": "on-failure",
    "RestartSec": "5",
    "WatchdogSec": "60",
    "TimeoutStopSec": "30",
    "KillMode": "control-group",
    "User": "%i",
    "StateDirectory": "slurm-supervisor/%i",
    "StateDirectoryMode": "0700",
    "RuntimeDirectory": "slurm-supervisor/%i",
    "RuntimeDirectoryMode": "0755",
    "ConfigurationDirectory": "slurm-supervisor",
    "UMask": "0077",
    "LimitNOFILE": "65536",
    "MemoryMax": "1G",
    "ProtectProc": "invisible",
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
    "CapabilityBoundingSet": "",
}


@pytest.mark.parametrize(("key", "value"), sorted(REQUIRED.items()))
def test_the_template_keeps_its_settings(key: str, value: str) -> None:
    assert service(TEMPLATE).get(key) == value, f"{key}= must stay {value!r}; see the comments in {TEMPLATE.name}"


def test_no_instance_gets_a_group_or_rights_beyond_its_account() -> None:
    """Group= would give every instance one shared group; capabilities would be node-level power."""
    unit = service(TEMPLATE)
    for key in ("Group", "SupplementaryGroups", "AmbientCapabilities", "DynamicUser"):
        assert unit.get(key, "") == "", key


def test_the_templates_folders_are_where_the_daemon_and_the_cli_look() -> None:
    """An instance's config names state_dir = /var/lib/slurm-supervisor/ACCOUNT; the socket the CLI
    then asks (the default) is in the unit's RuntimeDirectory."""
    unit = service(TEMPLATE)
    state = Path("/var/lib") / unit["StateDirectory"].replace("%i", "alice")
    runtime = Path("/run") / unit["RuntimeDirectory"].replace("%i", "alice")
    assert DaemonConfig().api.socket_path(state).parent == runtime
    assert state.parent == DaemonConfig().daemon.state_dir  # the single-user layout's dir is the parent
    assert f"/etc/{unit['ConfigurationDirectory']}/%i.toml" in unit["ExecStart"]


def test_the_user_unit_runs_from_the_users_own_folders() -> None:
    unit = service(USER_UNIT)
    assert unit["ExecStart"] == "/usr/bin/slurm-supervisor daemon --config %E/slurm-supervisor/supervisor.toml"
    assert unit["StateDirectory"] == "slurm-supervisor" and unit["StateDirectoryMode"] == "0700"
    assert (unit["Type"], unit["WatchdogSec"], unit["LimitNOFILE"], unit["MemoryMax"]) == (
        "notify",
        "60",
        "65536",
        "1G",
    )
    assert "User" not in unit and unit["NoNewPrivileges"] == "yes"


@pytest.mark.parametrize("unit", [TEMPLATE, USER_UNIT], ids=["template", "user"])
def test_nothing_hides_munge_or_home_directories(unit: Path) -> None:
    """Slurm clients need /run/munge; batch scripts often live under /home."""
    settings = service(unit)
    for key in ("InaccessiblePaths", "TemporaryFileSystem", "PrivateUsers", "DynamicUser", "PrivateNetwork"):
        assert key not in settings, f"{key}= would cut the Slurm clients off from munge, the scripts or slurmctld"
    assert settings.get("ProtectHome", "read-only") not in ("yes", "tmpfs")
    assert "AF_UNIX" in settings["RestrictAddressFamilies"].split()


# --------------------------------------------------------------------------- sysusers and tmpfiles


def test_sysusers_makes_the_admin_and_guard_groups_and_no_account(tmp_path: Path) -> None:
    """Instance accounts come from the site's directory service with one fixed UID cluster-wide
    (review finding #13): a dynamic local UID would be someone else's on the compute nodes."""
    (tmp_path / "etc").mkdir()
    result = run([systemd_tool("systemd-sysusers"), f"--root={tmp_path}", str(SYSUSERS)])
    assert result.returncode == 0, result.stderr
    groups = (tmp_path / "etc/group").read_text()
    assert "slurm-supervisor-admins:x:" in groups and "slurm-supervisor-guard:x:" in groups  # the guard socket's
    passwd = tmp_path / "etc/passwd"
    assert not passwd.exists() or "slurm-supervisor" not in passwd.read_text()


def test_tmpfiles_opens_the_parents_of_the_instances_folders(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("systemd-tmpfiles --create must chown, which needs root")
    old = tmp_path / "var/lib/slurm-supervisor"  # the single-user layout's state dir: 0700
    old.mkdir(parents=True)
    old.chmod(0o700)
    result = run([systemd_tool("systemd-tmpfiles"), f"--root={tmp_path}", "--create", str(TMPFILES)])
    assert result.returncode == 0, result.stderr
    for folder in ("var/lib/slurm-supervisor", "run/slurm-supervisor", "etc/slurm-supervisor"):
        st = (tmp_path / folder).stat()
        assert (st.st_mode & 0o777, st.st_uid, st.st_gid) == (0o755, 0, 0), folder


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
