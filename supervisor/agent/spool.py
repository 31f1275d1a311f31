"""The hooks' spool: reports kept on the node while the daemon cannot be reached.

Hooks run as root, so the spool folder is used only when nobody else could have planted anything
in it: it must be a real folder (not a link), owned by the hook's own user, with no access for
group or others (it is created so, 0700). Files are created through the folder's descriptor with
``O_EXCL | O_NOFOLLOW`` and read with ``O_NOFOLLOW | O_NONBLOCK`` as regular files only, so
neither a link nor a FIFO there can make a hook write elsewhere or block. A folder that fails the
check is not used at all: ``problem`` says why, and the hook notes it.
"""

from __future__ import annotations

import errno
import os
import stat
import time
import uuid
from pathlib import Path

import msgspec

from supervisor.domain.health.node_report import NodeReport, to_wire

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_MAX_FILE = 1 << 20  # a report is a few KiB; anything larger was not written by a hook


class Spool:
    """Reports kept on the node while the daemon cannot be reached (bounded; oldest dropped)."""

    def __init__(self, directory: Path, limit: int) -> None:
        self.dir = directory
        self.limit = limit
        self.problem: str | None = None  # why the folder was not used, when it was not

    def put(self, report: NodeReport) -> int:
        """Spool one report; how many were spooled (0 when the folder may not be used)."""
        data = msgspec.json.encode(to_wire(report))
        try:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            with _Folder(self.dir) as fd:
                name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
                _write(fd, name, data)
                for old in _names(fd)[: -self.limit]:
                    os.unlink(old, dir_fd=fd)
        except OSError as exc:
            self.problem = f"spool {self.dir} not used: {exc.strerror or exc}"
            return 0
        return 1

    def take(self) -> tuple[list[Path], list[NodeReport]]:
        """The spooled reports (oldest first) and their files; delete the files once sent."""
        files: list[Path] = []
        out: list[NodeReport] = []
        try:
            with _Folder(self.dir) as fd:
                for name in _names(fd):
                    report = _read(fd, name)
                    if report is not None:
                        out.append(report)
                        files.append(self.dir / name)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self.problem = f"spool {self.dir} not used: {exc.strerror or exc}"
        return files, out


class _Folder:
    """The spool folder's descriptor, once it passed the owner and mode check."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> int:
        self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        st = os.fstat(self.fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            os.close(self.fd)
            who = "owned by another user" if st.st_uid != os.geteuid() else f"mode {stat.S_IMODE(st.st_mode):o}"
            raise PermissionError(errno.EPERM, f"{who}; it must be the hook user's own, mode 700 (chmod 700, chown)")
        return self.fd

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def _names(fd: int) -> list[str]:
    return sorted(n for n in os.listdir(fd) if n.endswith(".json") and not n.startswith("."))


def _write(fd: int, name: str, data: bytes) -> None:
    tmp = f".{name}"
    out = os.open(tmp, _CREATE, 0o600, dir_fd=fd)
    try:
        os.write(out, data)
    finally:
        os.close(out)
    os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)


def _read(fd: int, name: str) -> NodeReport | None:
    """A spooled report; None (and the file removed) when it is not one a hook wrote."""
    try:
        file = os.open(name, _READ, dir_fd=fd)
    except OSError:
        _remove(fd, name)  # a link, or gone: never sent
        return None
    try:
        if not stat.S_ISREG(os.fstat(file).st_mode):
            raise ValueError("not a regular file")
        return msgspec.json.decode(os.read(file, _MAX_FILE), type=NodeReport)
    except (OSError, ValueError, msgspec.DecodeError, msgspec.ValidationError):
        _remove(fd, name)  # unreadable: it would never be sent
        return None
    finally:
        os.close(file)


def _remove(fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=fd)
    except OSError:
        pass
