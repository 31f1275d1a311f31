"""The SQLite store only on a local filesystem (issue 32, the review's smaller points).

SQLite's WAL mode keeps its index in shared memory beside the database and relies on working
POSIX locks; SQLite documents that WAL does not work over a network filesystem. The per-account
user unit keeps the store in ``~/.local/state``, which on clusters is usually NFS. So the daemon
refuses to open its store where ``/proc/self/mountinfo`` says the folder is on a network or
cluster filesystem, and says what to do instead.
"""

from __future__ import annotations

import os
from pathlib import Path

from supervisor.ports import PermanentError

NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs", "nfs4", "cifs", "smb3", "smbfs", "ncpfs", "afs", "9p", "lustre", "gpfs", "beegfs", "ceph",
        "glusterfs", "orangefs", "pvfs2", "davfs", "fuse.glusterfs", "fuse.sshfs", "fuse.s3fs", "fuse.rclone",
        "fuse.davfs", "fuse.cephfs", "fuse.beegfs",
    }
)  # fmt: skip
MOUNTINFO = Path("/proc/self/mountinfo")


class NetworkFilesystem(PermanentError):
    """The store's folder is on a filesystem SQLite's WAL does not work on."""


def refuse_network_filesystem(folder: Path, mountinfo: Path = MOUNTINFO) -> None:
    """``NetworkFilesystem`` when ``folder`` is on a network filesystem (unknown: allowed)."""
    try:
        table = mountinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return  # no /proc: nothing to go by
    kind = filesystem_of(os.path.realpath(folder), table)
    if kind in NETWORK_FILESYSTEMS:
        raise NetworkFilesystem(
            f"the store's folder {folder} is on a network filesystem ({kind}); SQLite's WAL does not work "
            "there (shared memory and locks of one host). Fix: set [daemon] state_dir to a folder on a local "
            "disk of this login node, or [store] url to a PostgreSQL database (docs/configuration.md)"
        )


def filesystem_of(path: str, mountinfo: str) -> str | None:
    """The type of the filesystem ``path`` (absolute, links resolved) is on, from the text of
    ``/proc/self/mountinfo``: the mount with the longest mount point above it."""
    best, kind = -1, None
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if "-" not in fields or len(fields) < 5:
            continue
        point = _unescape(fields[4])
        fstype = fields[fields.index("-") + 1] if fields.index("-") + 1 < len(fields) else None
        if _under(path, point) and len(point) >= best:
            best, kind = len(point), fstype
    return kind


def _under(path: str, point: str) -> bool:
    return point == "/" or path == point or path.startswith(point.rstrip("/") + "/")


def _unescape(text: str) -> str:
    """mountinfo writes a space, tab, newline and backslash in a path as octal (``\\040``)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        text = text.replace(code, char)
    return text
