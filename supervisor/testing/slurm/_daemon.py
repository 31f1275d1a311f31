"""Processes of the private test cluster: finding binaries, spawning daemons (optionally inside a
cgroup), stopping them, and describing a failure with the tail of the daemon's logs."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog

from supervisor.testing.slurm._cgroup import Cgroup, find_cgroup_parent

log = structlog.get_logger()

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "sinfo", "scontrol", "scancel")
_SBIN_DIRS = ("/usr/sbin", "/sbin", "/usr/local/sbin")
# Inherited variables that would change what Slurm clients and daemons do.
_DROPPED_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SQUEUE_", "SINFO_", "SCONTROL_", "SALLOC_", "SRUN_")


class LocalSlurmError(RuntimeError):
    """The private cluster could not start, or one of its daemons died. Names the daemon."""


def search_path() -> str:
    """PATH plus the sbin directories (a non-login root shell may lack them)."""
    parts = os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
    return os.pathsep.join(parts + [d for d in _SBIN_DIRS if d not in parts])


def find_binary(name: str) -> str | None:
    return shutil.which(name, path=search_path())


def unavailable_reason() -> str | None:
    """Why a LocalSlurm cannot start here, or None when it should."""
    missing = [b for b in DAEMONS + CLIENTS if find_binary(b) is None]
    if missing:
        return f"Slurm/munge binaries not found: {', '.join(missing)}"
    if os.geteuid() != 0:
        return "LocalSlurm needs root (slurmd launches jobs, cgroups must be created)"
    if find_cgroup_parent() is None:
        return "no writable cgroup2 mount with cgroup.kill and cgroup.freeze (needed for fault injection)"
    return None


def clean_env(extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment without Slurm's input variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED_ENV_PREFIXES)}
    env.update(extra)
    return env


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 right now (held open until all are chosen).

    Drawn below the kernel's ephemeral range: a port from bind(0) may also be the local end of
    another program's client connections in TIME_WAIT, and slurmctld/slurmd then fail to listen
    on it ("Address already in use") on a host where other tests open many connections."""
    low, high = 10_000, _ephemeral_start() - 1
    socks: list[socket.socket] = []
    try:
        for port in random.sample(range(low, high), k=min(high - low, 50 * count + 50)):
            if len(socks) == count:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            socks.append(s)
        if len(socks) < count:
            raise LocalSlurmError(f"found only {len(socks)} of {count} free ports below {high + 1}")
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def tail(path: Path | None, lines: int = 25) -> str:
    if path is None or not path.exists():
        return f"(no file {path})"
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:]) or "(empty)"


@dataclass
class Daemon:
    """One daemon: its argv, where its output and log go, its cgroup, its current process."""

    name: str
    argv: list[str]
    out: Path
    log: Path | None
    cgroup: Cgroup | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.alive and self.proc is not None else None

    def describe(self, what: str) -> str:
        status = None if self.proc is None else self.proc.poll()
        return (
            f"{self.name} {what} (exit status {status})\n"
            f"--- tail of {self.log} ---\n{tail(self.log)}\n"
            f"--- tail of {self.out} ---\n{tail(self.out)}"
        )

    def spawn(self, env: Mapping[str, str]) -> None:
        """Start the daemon (inside its cgroup from the first instruction, when it has one)."""
        argv = self.cgroup.exec_argv(self.argv) if self.cgroup else self.argv
        with open(self.out, "ab") as out:
            self.proc = subprocess.Popen(  # noqa: S603 - fixed argv, no shell
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,
            )
        log.debug("localslurm.spawned", daemon=self.name, pid=self.proc.pid)

    def terminate(self, *, timeout: float, sig: int = signal.SIGTERM) -> None:
        """Signal the daemon and wait; SIGKILL it (and its cgroup) when it does not exit."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5.0)
        if self.cgroup is not None:
            self.cgroup.kill()
            self.cgroup.wait_empty(5.0)

    def kill(self) -> None:
        """SIGKILL the daemon and everything in its cgroup (job processes), even when frozen."""
        if self.cgroup is not None and self.cgroup.exists:
            self.cgroup.kill()
            if not self.cgroup.wait_empty(5.0):
                raise LocalSlurmError(f"{self.name}: processes left in {self.cgroup.path}")
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(5.0)

    def wait_ready(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``ready``; raise LocalSlurmError with the log tails when the daemon dies or
        ``timeout`` passes first."""
        deadline = time.monotonic() + timeout
        while not ready():
            if not self.alive:
                raise LocalSlurmError(self.describe("exited during startup"))
            if time.monotonic() > deadline:
                raise LocalSlurmError(self.describe(f"{what} within {timeout:.0f} s"))
            time.sleep(0.05)
