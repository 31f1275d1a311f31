"""Run a block of a test as 'nobody' when the tests run as root (root reads through permission
bits, so permission errors can only be seen unprivileged)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

NOBODY = 65534


@contextlib.contextmanager
def as_nobody() -> Iterator[None]:
    if os.geteuid() != 0:
        yield
        return
    os.setegid(NOBODY)  # the group first: root's group would pick a file's (closed) group bits
    os.seteuid(NOBODY)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


def open_path_to(path: Path) -> None:
    """Let others traverse every folder above ``path`` (pytest makes its temporary folders 0700)."""
    for d in (path, *path.parents):
        if d == Path("/") or d.stat().st_mode & 0o001:
            break
        d.chmod(d.stat().st_mode | 0o005)
