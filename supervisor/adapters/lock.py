"""Exactly one daemon per state directory: an exclusive, non-blocking flock on a lock file."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType


class AlreadyRunning(RuntimeError):
    pass


class StateDirLock:
    def __init__(self, state_dir: str | Path) -> None:
        self.path = Path(state_dir) / "daemon.lock"
        self._fd: int | None = None

    def __enter__(self) -> StateDirLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise AlreadyRunning(
                f"another slurm-supervisor daemon (pid {holder}) holds {self.path}; "
                "stop it first (systemctl stop slurm-supervisor) or use another state_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
