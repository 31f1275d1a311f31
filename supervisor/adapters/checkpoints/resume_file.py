"""The resume file: the chosen checkpoint written where the job's nodes can read it.

Written atomically (a temporary file in the same folder, fsync, rename), so a job starting while
the supervisor writes it reads the old plan or the new one, never half of one. Readable by the
job's user: mode 0644 (it names storage locations, never credentials).

The path is a run's (its spec names it) and the daemon writes it as its own user, so it is written
through the folder's descriptor: the folder may not be one of the daemon's own (``protected``,
checked on the folder the kernel opened, links resolved), the temporary file is created with
``O_EXCL | O_NOFOLLOW``, and a resume file that exists as anything but a regular file (a link, a
FIFO, a folder) is refused rather than replaced. The rename replaces the folder entry, never a
file a link points to.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Sequence
from pathlib import Path

from supervisor.adapters.run_files import RunFileRefused, check_outside, daemon_dirs

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def write_resume_file(path: str, text: str, protected: Sequence[str] | None = None) -> None:
    """Write ``text`` to ``path`` atomically; ``RunFileRefused`` (an OSError) where it may not."""
    target = Path(path)
    dir_fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        # the folder, and the name in it: a secret file of the daemon's may lie in a folder of the run's
        check_outside(dir_fd, target.parent, daemon_dirs() if protected is None else protected, target.name)
        _refuse_non_regular(dir_fd, target)
        _replace(dir_fd, target.name, text.encode("utf-8"))
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _refuse_non_regular(dir_fd: int, target: Path) -> None:
    try:
        mode = os.stat(target.name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise RunFileRefused(target, "not a regular file (a link, FIFO or folder); the supervisor will not replace it")


def _replace(dir_fd: int, name: str, data: bytes) -> None:
    tmp = f".{name}.{secrets.token_hex(6)}"
    fd = os.open(tmp, _CREATE, 0o644, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fchmod(out.fileno(), 0o644)
            os.fsync(out.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        raise
