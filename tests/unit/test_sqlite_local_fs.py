"""Issue 32 (the review's smaller points): the SQLite store is refused on a network filesystem
with a clear error (SQLite's WAL does not work there; the user unit's ~/.local/state is often NFS).
Before: the store opened, WAL and all, wherever its folder was. The mount table is passed in,
as /proc/self/mountinfo's text."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.adapters.sqlite import SqliteStore
from supervisor.adapters.sqlite.local_fs import NetworkFilesystem, filesystem_of, refuse_network_filesystem

MOUNTS = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:35 / /home rw,relatime shared:20 - nfs4 filer:/home rw,vers=4.2
41 40 0:36 / /home/alice/local\\040disk rw,relatime - xfs /dev/sdb1 rw
42 22 0:37 / /lustre rw - lustre 10.0.0.1@o2ib:/fs rw
"""


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/home/alice/.local/state/slurm-supervisor", "nfs4"),
        ("/home/alice/local disk/state", "xfs"),  # a local mount below the NFS one
        ("/var/lib/slurm-supervisor/alice", "ext4"),
        ("/lustre/team", "lustre"),
        ("/homework", "ext4"),  # not under /home
    ],
)
def test_the_filesystem_of_a_folder_is_its_deepest_mounts(path: str, kind: str) -> None:
    assert filesystem_of(path, MOUNTS) == kind


def test_a_store_on_nfs_is_refused_with_what_to_do(tmp_path: Path) -> None:
    table = tmp_path / "mountinfo"
    table.write_text(f"22 1 8:1 / / rw - ext4 /dev/sda1 rw\n40 22 0:35 / {tmp_path} rw - nfs4 filer:/x rw\n")
    with pytest.raises(NetworkFilesystem, match=r"network filesystem \(nfs4\).*state_dir.*\[store\] url"):
        refuse_network_filesystem(tmp_path / "state", table)
    refuse_network_filesystem(tmp_path / "state", tmp_path / "no-such-table")  # nothing to go by: allowed


def test_the_daemons_store_opens_on_this_hosts_local_disk(tmp_path: Path) -> None:
    SqliteStore(tmp_path / "state").close()
