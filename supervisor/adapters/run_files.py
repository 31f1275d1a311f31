"""Opening the files a run names (its output, its resume file) without trusting the names.

The daemon reads and writes them as its own user, so a run spec (or the job, which may swap its
own output file) could otherwise point them at the daemon's database, tokens and secrets, or at a
FIFO that blocks the engine thread forever. Here every such file is opened with ``O_NOFOLLOW``
(no link at the last component) and ``O_NONBLOCK`` (a FIFO does not wait for a writer), must be a
regular file, and may not lie in the daemon's own folders, checked on the path the kernel opened
(``/proc/self/fd``), so a linked folder above it does not help either.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Sequence

from supervisor.config.run_file import DEFAULT_DAEMON_DIRS, inside

# systemd's directories for the unit (StateDirectory= and friends), when it runs under one.
_SYSTEMD_DIRS = ("STATE_DIRECTORY", "RUNTIME_DIRECTORY", "CONFIGURATION_DIRECTORY", "CACHE_DIRECTORY", "LOGS_DIRECTORY")
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


class RunFileRefused(OSError):
    """A run's file the daemon will not open: what it is, and why not."""

    def __init__(self, path: str | os.PathLike[str], why: str) -> None:
        super().__init__(errno.EPERM, f"{os.fspath(path)}: {why}")


def daemon_dirs(extra: Iterable[str | os.PathLike[str]] = ()) -> tuple[str, ...]:
    """The daemon's own folders (and secret files): the shipped defaults, systemd's directories
    for the unit when it runs under one, and ``extra`` (the configured ones)."""
    found = list(DEFAULT_DAEMON_DIRS)
    for name in _SYSTEMD_DIRS:
        found += [d for d in os.environ.get(name, "").split(":") if d]
    found += [os.fspath(d) for d in extra]
    return tuple(dict.fromkeys(found))


def opened_path(fd: int, fallback: str | os.PathLike[str]) -> str:
    """The path the kernel opened ``fd`` at (links resolved), else ``fallback`` resolved."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(fallback)


def check_outside(fd: int, path: str | os.PathLike[str], protected: Sequence[str], name: str = "") -> None:
    """Raise :class:`RunFileRefused` when the open ``fd`` (with ``name``: the entry ``name`` in the
    folder ``fd``) lies in one of the ``protected`` folders or is one of its secret files."""
    folder = inside(os.path.join(opened_path(fd, path), name) if name else opened_path(fd, path), protected)
    if folder is not None:
        raise RunFileRefused(path, f"inside the supervisor's own folder {folder}; a run's files may not be there")


def open_run_file(path: str | os.PathLike[str], protected: Sequence[str] | None = None) -> int:
    """A read-only fd on the regular file at ``path``; FileNotFoundError when there is none,
    :class:`RunFileRefused` for a link, a FIFO, a device, a folder or a file of the daemon's."""
    try:
        fd = os.open(path, _READ)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RunFileRefused(
                path, "a symbolic link; the supervisor does not follow links to a run's files"
            ) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RunFileRefused(path, "not a regular file (a FIFO, device or folder); the supervisor reads only files")
        check_outside(fd, path, daemon_dirs() if protected is None else protected)
    except BaseException:
        os.close(fd)
        raise
    return fd
