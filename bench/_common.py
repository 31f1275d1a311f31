"""Helpers shared by the benchmarks: the real daemon as a subprocess, its config files, and cheap
views of the private cluster (LocalSlurm) taken with Slurm's text clients.

Only public pieces of the package are used (``supervisor.testing.LocalSlurm``); nothing is
imported from ``tests/``.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import hostlist

from supervisor.testing import LocalSlurm

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
SUPERVISOR = str(VENV_BIN / "slurm-supervisor")
TAG_PREFIX = "slurm-supervisor"  # jobs carry --comment=slurm-supervisor:RUN:INTENT


# ---------------------------------------------------------------------------- Slurm releases

RELEASE_VENV_PYTHON = "/opt/ssv-venv/bin/python"  # the venv in each release's root (scripts/slurm-release)


def run_on_release(release: str | None) -> None:
    """``--slurm-release R``: run this benchmark again inside the root of release R of the matrix
    (scripts/slurm-release: built once, cached), with the same arguments but this one, unless R is
    the host's own Slurm or this process already runs inside that root. Returns only then."""
    if not release or os.environ.get("SSV_SLURM_RELEASE") == release:
        return
    tool = str(REPO / "scripts" / "slurm-release")
    host = subprocess.run([tool, "host"], capture_output=True, text=True, check=True).stdout.strip()
    if host == release:
        return
    args = _without_release(sys.argv[1:])
    script = str(Path(sys.argv[0]).resolve())
    # PYTHONPATH: the root's venv may last have been installed from another checkout
    env = [f"SSV_SLURM_RELEASE={release}", f"PYTHONPATH={REPO}"]
    argv = [tool, "run", release, "env", *env, RELEASE_VENV_PYTHON, script, *args]  # run: installs first
    sys.stdout.flush()
    os.execv(tool, argv)


def _without_release(args: list[str]) -> list[str]:
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--slurm-release":
            skip = True
        elif not arg.startswith("--slurm-release="):
            out.append(arg)
    return out


def slurm_version(cluster: LocalSlurm) -> str:
    """The cluster's Slurm release, as ``squeue --version`` prints it (e.g. "24.11.5")."""
    out = subprocess.run(["squeue", "--version"], env=client_env(cluster), capture_output=True, text=True).stdout
    return out.split()[-1] if out.split() else "unknown"


def client_env(cluster: LocalSlurm) -> dict[str, str]:
    """This process's environment without inherited SLURM_* variables, plus the cluster's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SQUEUE_"))}
    env.update(cluster.env)
    return env


# ---------------------------------------------------------------------------- config files


def toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string literal is a valid TOML basic string


def write_daemon_config(
    path: Path,
    cluster: LocalSlurm,
    state_dir: Path,
    *,
    poll_interval_s: float,
    probe_timeout_s: float = 1.0,
    confirm_after_s: float = 1.0,
    log_level: str = "info",
) -> Path:
    path.write_text(
        "[daemon]\n"
        f"state_dir = {toml_str(str(state_dir))}\n"
        f"poll_interval_s = {poll_interval_s}\n"
        "may_change_nodes = true\n"
        "max_drains_per_hour = 100\n"
        "max_drains_per_run_per_hour = 100\n\n"
        "[slurm]\n"
        f"slurm_conf = {toml_str(str(cluster.slurm_conf))}\n"
        'bin_dir = "/usr/bin"\n'
        "command_timeout_s = 20.0\n\n"
        "[probe]\n"
        "enabled = true\n"
        f"timeout_s = {probe_timeout_s}\n"
        f"confirm_after_s = {confirm_after_s}\n\n"
        "[ingest]\n"
        'bind = "127.0.0.1"\n'
        "port = 0\n\n"
        "[logging]\n"
        f'level = "{log_level}"\n'
        'format = "json"\n'
    )
    return path


def write_run_spec(
    path: Path,
    *,
    name: str,
    script: Path,
    partition: str,
    nodes: int,
    output: Path,
    spares: str | None = None,
    max_restarts: int = 10,
) -> Path:
    text = (
        "[run]\n"
        f"name = {toml_str(name)}\n"
        f"script = {toml_str(str(script))}\n"
        f"partition = {toml_str(partition)}\n"
        f"nodes = {nodes}\n"
        f"output = {toml_str(str(output))}\n"
        f"workdir = {toml_str(str(output.parent))}\n\n"
    )
    if spares:
        text += f'[spares]\npolicy = "named"\nnodes = {toml_str(spares)}\n\n'
    text += f"[restart]\nmax_restarts = {max_restarts}\n"
    path.write_text(text)
    return path


def write_script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/bash\n" + body.strip() + "\n")
    path.chmod(0o755)
    return path


# ---------------------------------------------------------------------------- the daemon


def user_prefix(user: str | None) -> list[str]:
    """argv prefix that runs a command as ``user`` (with its groups), or nothing."""
    if user is None:
        return []
    return ["setpriv", "--reuid", user, "--regid", user, "--init-groups", "--"]


# The venv's interpreter may live where another user cannot reach it (here: under /root, mode
# 0700). Another user then runs the same installed package with a system interpreter of the same
# Python version, the venv's site-packages added (its .pth files make the editable install work).
_LAUNCHER = (
    "import site,sys\n"
    "site.addsitedir(sys.argv.pop(1))\n"
    "sys.argv[0]='slurm-supervisor'\n"
    "from supervisor.cli import main\n"
    "main()\n"
)


def _reachable_by(user: str, path: str) -> bool:
    result = subprocess.run([*user_prefix(user), "test", "-x", path], check=False)  # noqa: S603
    return result.returncode == 0


@functools.cache
def supervisor_argv(user: str | None = None) -> list[str]:
    """argv that runs the ``slurm-supervisor`` CLI, as ``user`` when given."""
    if user is None:
        return [SUPERVISOR]
    if _reachable_by(user, sys.executable) and _reachable_by(user, SUPERVISOR):
        return [*user_prefix(user), SUPERVISOR]
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system_python = next(
        (
            p
            for p in (f"/usr/bin/{version}", f"/usr/local/bin/{version}")
            if os.path.exists(p) and _reachable_by(user, p)
        ),
        None,
    )
    if system_python is None:
        raise RuntimeError(f"user {user} can reach neither {sys.executable} nor a system {version}")
    site_packages = sysconfig.get_paths()["purelib"]
    return [*user_prefix(user), system_python, "-I", "-c", _LAUNCHER, site_packages]


@dataclass
class DaemonProc:
    proc: subprocess.Popen[bytes]
    log_path: Path

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM (the daemon leaves jobs alone) and wait; SIGKILL if it does not stop."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_records(self) -> list[dict]:
        records = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    records.append(json.loads(line))
                except ValueError:
                    pass
        return records

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def start_daemon(config: Path, cluster: LocalSlurm, log_path: Path, *, user: str | None = None) -> DaemonProc:
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(  # noqa: S603 - fixed argv
            [*supervisor_argv(user), "--config", str(config), "daemon"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=client_env(cluster),
            start_new_session=True,
        )
    _wait_api(config, proc)
    return DaemonProc(proc, log_path)


def _wait_api(config: Path, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Until the daemon's local API accepts connections (the CLI's changes go through it) or it exits."""
    import time

    from supervisor.api.client import ApiClient
    from supervisor.config import load_daemon_config

    cfg = load_daemon_config(config)
    client = ApiClient(cfg.api.socket_path(cfg.daemon.state_dir))
    deadline = time.monotonic() + timeout
    while proc.poll() is None and not client.reachable() and time.monotonic() < deadline:
        time.sleep(0.05)


def supervisor_cli(
    config: Path, cluster: LocalSlurm, *args: str, user: str | None = None, timeout: float = 60.0
) -> str:
    result = subprocess.run(  # noqa: S603 - fixed argv
        [*supervisor_argv(user), "--config", str(config), *args],
        capture_output=True,
        text=True,
        env=client_env(cluster),
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"slurm-supervisor {' '.join(args)} failed ({result.returncode}): "
            f"{result.stderr.strip() or result.stdout.strip()}"
        )
    return result.stdout


# ---------------------------------------------------------------------------- cluster views


@dataclass(frozen=True)
class Job:
    job_id: int
    state: str
    nodes: tuple[str, ...]
    batch_host: str
    comment: str
    name: str


_SEP = "\x1f"  # never in a comment, a node list or a job name we create


def jobs(cluster: LocalSlurm) -> list[Job] | None:
    """Pending/running/completing jobs from one ``squeue`` (text output: one RPC, cheaper to parse
    than --json). None when squeue fails (controller busy or down)."""
    fmt = _SEP.join(("%i", "%T", "%N", "%B", "%k", "%j"))
    result = cluster.run(["squeue", "-h", "-a", "-o", fmt], timeout=15)
    if result.returncode != 0:
        return None
    found = []
    for line in result.stdout.splitlines():
        parts = line.split(_SEP)
        if len(parts) != 6 or not parts[0].strip().isdigit():
            continue
        node_list = parts[2].strip()
        nodes = tuple(hostlist.expand_hostlist(node_list)) if node_list and node_list != "(null)" else ()
        found.append(Job(int(parts[0]), parts[1].strip(), nodes, parts[3].strip(), parts[4].strip(), parts[5].strip()))
    return found


def steps_running(cluster: LocalSlurm, job_id: int) -> bool:
    """Whether the job has a running step other than the batch step (its srun has started)."""
    result = cluster.run(["squeue", "-h", "-s", "-j", str(job_id), "-o", "%i"], timeout=15)
    return result.returncode == 0 and any(
        line.strip().startswith(f"{job_id}.") and line.strip().split(".", 1)[1].isdigit()
        for line in result.stdout.splitlines()
    )


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    return LocalSlurm.wait_for(predicate, timeout, interval=interval, message=what)


# ---------------------------------------------------------------------------- figures


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    cells = [list(map(str, header))] + [[("-" if c is None else str(c)) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def quiet_logs() -> None:
    """LocalSlurm logs its life with structlog; keep the benchmark's stdout to the table."""
    import logging

    import structlog

    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
