"""The POSIX object backend on real directories: listing, the root it cannot leave, symlinks,
chunked reads, the size cap, the no-overwrite put under concurrency, and errno mapping.
(The store contract suite in tests/checkpoints/ runs the shared checks against it too.)"""

from __future__ import annotations

import errno
import os
import stat
import threading
from pathlib import Path

import pytest

from supervisor.adapters.checkpoints.backend import StorageError
from supervisor.adapters.checkpoints.posix import PosixBackend, storage_error
from supervisor.testing.slurm.privileges import as_nobody, open_path_to


@pytest.fixture
def backend(tmp_path: Path) -> PosixBackend:
    return PosixBackend(str(tmp_path / "ckpt"))


def test_put_list_head_read(backend: PosixBackend) -> None:
    assert list(backend.list()) == []  # the root does not exist yet: nothing written
    assert backend.put("step_10/b/shard1", b"b" * 3)
    assert backend.put("step_10/a", b"a" * 5)
    assert backend.put("step_100/a", b"x")
    keys = [(o.key, o.size) for o in backend.list()]
    assert keys == [("step_10/a", 5), ("step_10/b/shard1", 3), ("step_100/a", 1)]
    assert [o.key for o in backend.list("step_10/")] == ["step_10/a", "step_10/b/shard1"]
    # S3 semantics: a plain string prefix
    assert [o.key for o in backend.list("step_10")] == ["step_10/a", "step_10/b/shard1", "step_100/a"]
    assert [o.key for o in backend.list("step_10/b")] == ["step_10/b/shard1"]
    info = backend.head("step_10/a")
    assert info is not None and (info.size, info.checksums, info.version_id) == (5, {}, None)
    assert info.modified_at == pytest.approx(os.stat(backend.location("step_10/a")).st_mtime)
    assert backend.head("step_10/missing") is None and backend.head("step_10/a/below") is None
    assert backend.head("step_10") is None  # a directory is not an object
    assert backend.location("step_10/") == os.path.join(backend.root, "step_10")


def test_read_streams_in_chunks_and_absence_is_keyerror(backend: PosixBackend) -> None:
    data = os.urandom(10_000)
    backend.put("s/x", data)
    chunks = list(backend.read("s/x", chunk_size=4096))
    assert [len(c) for c in chunks] == [4096, 4096, 1808] and b"".join(chunks) == data
    with pytest.raises(KeyError):
        backend.read("s/nope")


def test_get_small_caps_the_size(backend: PosixBackend) -> None:
    backend.put("m", b"12345")
    assert backend.get_small("m") == b"12345"
    assert backend.get_small("absent") is None
    with pytest.raises(ValueError, match="more than the 4 allowed"):
        backend.get_small("m", max_bytes=4)


@pytest.mark.parametrize("key", ["/etc/passwd", "../escape", "a/../../b", "a//b", "./a", "a/./b", "a\0b", "a\\b"])
def test_keys_cannot_leave_the_root(backend: PosixBackend, key: str) -> None:
    for call in (
        lambda: backend.head(key),
        lambda: backend.put(key, b"x"),
        lambda: backend.get_small(key),
        lambda: backend.read(key),
    ):
        with pytest.raises(ValueError, match="key"):
            call()


def test_symlinks_out_of_the_root_are_neither_listed_nor_read(tmp_path: Path, backend: PosixBackend) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"s")
    backend.put("step_1/real", b"r")
    root = Path(backend.root)
    (root / "step_1" / "link_file").symlink_to(outside / "secret")
    (root / "step_1" / "link_dir").symlink_to(outside)
    (root / "step_1" / "inside_link").symlink_to(root / "step_1" / "real")
    (root / "latest").symlink_to(root / "step_1")  # a common convenience link: not walked twice
    assert [o.key for o in backend.list()] == ["step_1/inside_link", "step_1/real"]
    with pytest.raises(StorageError, match="symlink out of the checkpoint root") as caught:
        backend.head("step_1/link_file")
    assert not caught.value.transient
    with pytest.raises(StorageError):
        backend.get_small("step_1/link_dir/secret")


def test_put_if_absent_never_overwrites_and_leaves_no_temp_files(backend: PosixBackend) -> None:
    assert backend.put("step_1/ssv-manifest.json", b"first", if_absent=True)
    assert not backend.put("step_1/ssv-manifest.json", b"second", if_absent=True)
    assert backend.get_small("step_1/ssv-manifest.json") == b"first"
    assert backend.put("step_1/ssv-manifest.json", b"third")  # a plain put replaces
    assert backend.get_small("step_1/ssv-manifest.json") == b"third"
    assert sorted(os.listdir(Path(backend.root) / "step_1")) == ["ssv-manifest.json"]
    with pytest.raises(ValueError, match="directory"):
        backend.put("step_1/", b"x")


def test_concurrent_if_absent_puts_have_exactly_one_winner(backend: PosixBackend) -> None:
    results: list[tuple[int, bool]] = []
    start = threading.Barrier(8)

    def writer(i: int) -> None:
        start.wait()
        results.append((i, backend.put("c/ssv-manifest.json", f"writer {i}".encode() * 1000, if_absent=True)))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, ok in results if ok]
    assert len(results) == 8 and len(winners) == 1
    assert backend.get_small("c/ssv-manifest.json") == f"writer {winners[0]}".encode() * 1000
    assert os.listdir(Path(backend.root) / "c") == ["ssv-manifest.json"]


def test_errno_mapping() -> None:
    for code in (errno.EIO, errno.ESTALE, errno.ETIMEDOUT, errno.EAGAIN):
        err = storage_error(OSError(code, os.strerror(code)), "reading x")
        assert err.transient and errno.errorcode[code] in str(err)
    for code in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC):
        assert not storage_error(OSError(code, os.strerror(code)), "reading x").transient


def test_unreadable_directory_is_a_permanent_storage_error(tmp_path: Path) -> None:
    open_path_to(tmp_path)
    backend = PosixBackend(str(tmp_path / "ckpt"))
    backend.put("locked/a", b"x")
    os.chmod(Path(backend.root) / "locked", 0)
    try:
        with as_nobody(), pytest.raises(StorageError) as caught:
            list(backend.list())
        assert not caught.value.transient and "EACCES" in str(caught.value)
    finally:
        os.chmod(Path(backend.root) / "locked", 0o755)


def test_a_manifest_is_readable_by_others_as_the_umask_allows(backend: PosixBackend) -> None:
    old = os.umask(0o022)
    try:
        backend.put("s/ssv-manifest.json", b"{}", if_absent=True)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(backend.location("s/ssv-manifest.json")).st_mode) == 0o644


def test_a_file_where_the_root_should_be(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"x")
    b = PosixBackend(str(tmp_path / "file"))
    assert list(b.list()) == []
    with pytest.raises(StorageError, match="ENOTDIR|EEXIST") as caught:
        b.put("a", b"x")
    assert not caught.value.transient
