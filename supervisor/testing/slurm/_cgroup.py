"""Minimal cgroup v2 helpers for the private test cluster (fault injection and cleanup)."""

from __future__ import annotations

import contextlib
import secrets
import sys
import time
from pathlib import Path

# Run by a fresh interpreter: move itself into the cgroup, then become the daemon. Doing it
# before exec (instead of moving the daemon after Popen) leaves no window in which the daemon
# could fork a child outside the cgroup, and avoids preexec_fn (unsafe with threads).
_ENTER_AND_EXEC = (
    "import os,sys\n"
    "fd=os.open(sys.argv[1],os.O_WRONLY)\n"
    "os.write(fd,b'0')\n"
    "os.close(fd)\n"
    "os.execv(sys.argv[2],sys.argv[2:])\n"
)


def _cgroup2_mounts() -> list[Path]:
    try:
        text = Path("/proc/self/mounts").read_text()
    except OSError:
        return []
    return [Path(f.split()[1]) for f in text.splitlines() if len(f.split()) > 2 and f.split()[2] == "cgroup2"]


def _own_cgroup() -> str:
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:].strip().lstrip("/")
    except OSError:
        pass
    return ""


def _usable(parent: Path) -> bool:
    probe = parent / f"localslurm-probe-{secrets.token_hex(4)}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        return (probe / "cgroup.kill").exists() and (probe / "cgroup.freeze").exists()
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


def find_cgroup_parent() -> Path | None:
    """A writable cgroup2 directory that supports cgroup.kill and cgroup.freeze, or None."""
    own = _own_cgroup()
    for mount in _cgroup2_mounts():
        for candidate in (mount / own, mount) if own else (mount,):
            if (candidate / "cgroup.procs").exists() and _usable(candidate):
                return candidate
    return None


class Cgroup:
    """One cgroup v2 directory."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def create(self) -> Cgroup:
        self.path.mkdir(exist_ok=True)
        return self

    @property
    def exists(self) -> bool:
        return self.path.is_dir()

    def _write(self, name: str, value: str) -> None:
        (self.path / name).write_text(value)

    def kill(self) -> None:
        """SIGKILL every process in the cgroup (and its children), atomically."""
        if self.exists:
            self._write("cgroup.kill", "1")

    def freeze(self, frozen: bool = True) -> None:
        self._write("cgroup.freeze", "1" if frozen else "0")

    @property
    def frozen(self) -> bool:
        return self._events().get("frozen") == "1"

    def _events(self) -> dict[str, str]:
        try:
            lines = (self.path / "cgroup.events").read_text().splitlines()
        except OSError:
            return {}
        return dict(line.split(" ", 1) for line in lines if " " in line)

    @property
    def populated(self) -> bool:
        return self._events().get("populated") == "1"

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def wait_empty(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.populated:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def destroy(self, timeout: float = 5.0) -> None:
        """Kill everything inside, wait for it to be gone, remove the directory (children first)."""
        if not self.exists:
            return
        self.kill()
        self.wait_empty(timeout)
        for child in sorted((p for p in self.path.iterdir() if p.is_dir()), reverse=True):
            Cgroup(child).destroy(timeout)
        with contextlib.suppress(OSError):
            self.path.rmdir()

    def exec_argv(self, argv: list[str]) -> list[str]:
        """An argv that runs ``argv`` (absolute program path) inside this cgroup."""
        return [sys.executable, "-I", "-S", "-c", _ENTER_AND_EXEC, str(self.path / "cgroup.procs"), *argv]


def pid_alive(pid: int) -> bool:
    """True when the process exists and is not a zombie (kill -0 succeeds on zombies)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


__all__ = ["Cgroup", "find_cgroup_parent", "pid_alive"]
