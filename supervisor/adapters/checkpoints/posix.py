"""The object interface on a directory tree: Lustre, GPFS, NFS or a local disk.

Keys are "/"-separated paths relative to the root. A key can never leave the root: absolute keys,
".." and empty components are refused, listings do not descend into symlinked directories, and a
symlink whose target lies outside the root is neither listed nor read.

POSIX keeps no checksums, so ``head`` returns ``checksums={}`` and metadata verification checks
presence and size only; full verification reads every byte.

The manifest is written with ``put(if_absent=True)``: the bytes go to a temporary file in the same
directory, which is fsynced and then hard-linked to the final name, and the directory is fsynced.
``link`` fails with EEXIST when the name exists, atomically, on local filesystems and on NFS, Lustre
and GPFS alike, and the name only ever appears with its complete contents. ``rename`` would do the
latter but silently replaces an existing manifest (a commit marker must be written once), and
``O_CREAT|O_EXCL`` on the final name refuses to overwrite but lets a reader see a half-written
manifest, which would be judged a broken commit.
"""

from __future__ import annotations

import errno
import io
import os
import secrets
import stat
from collections.abc import Iterator

from supervisor.adapters.checkpoints.backend import StorageError
from supervisor.domain.checkpoints.manifest import ChecksumAlgorithm, ObjectInfo

# errno values where trying again later may help: the file server is slow, failing over or away
_TRANSIENT = frozenset(
    {
        errno.EIO,
        errno.ESTALE,
        errno.ETIMEDOUT,
        errno.EAGAIN,
        errno.EINTR,
        errno.EBUSY,
        errno.ENOLCK,
        errno.EHOSTDOWN,
        errno.EHOSTUNREACH,
        errno.ECONNRESET,
        errno.ECONNREFUSED,
        errno.ENETDOWN,
        errno.ENETUNREACH,
        errno.ECONNABORTED,
    }
)
# where it will not, until someone acts
_PERMANENT = frozenset(
    {
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.ENOSPC,
        errno.EDQUOT,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.ELOOP,
        errno.ENAMETOOLONG,
        errno.EINVAL,
        errno.ENOTSUP,
        errno.EOPNOTSUPP,
        errno.EXDEV,
        errno.EEXIST,
    }
)


_Infos = list[ObjectInfo]
_Entries = list[os.DirEntry[str]]  # (the class's own ``list`` method shadows the builtin inside it)


def storage_error(exc: OSError, what: str) -> StorageError:
    """An OSError as a StorageError, transient unless the errno says someone must act first."""
    code = exc.errno if exc.errno is not None else -1
    name = errno.errorcode.get(code, str(code))
    return StorageError(f"{what}: {name}: {exc.strerror or exc}", transient=code not in _PERMANENT)


class PosixBackend:
    """ObjectBackend on the directory ``root`` (created on the first ``put`` if absent)."""

    def __init__(self, root: str) -> None:
        if not root or "\0" in root:
            raise ValueError(f"checkpoint root {root!r} is not a path")
        self.root = os.path.abspath(os.path.expanduser(root))

    def __repr__(self) -> str:
        return f"PosixBackend({self.root!r})"

    # ---------------------------------------------------------------- paths

    def _path(self, key: str) -> str:
        """The filesystem path of ``key``; ValueError for a key that could leave the root."""
        if "\0" in key or key.startswith("/") or "\\" in key:
            raise ValueError(f"object key {key!r} must be relative and '/'-separated")
        parts = key.split("/")
        if parts and parts[-1] == "":
            parts.pop()  # "dir/" names the directory
        if any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"object key {key!r} has an empty, '.' or '..' component")
        return os.path.join(self.root, *parts) if parts else self.root

    def _contained(self, path: str) -> bool:
        real, root = os.path.realpath(path), os.path.realpath(self.root)
        return real == root or real.startswith(root.rstrip(os.sep) + os.sep)

    def location(self, key: str) -> str:
        return self._path(key)

    # ---------------------------------------------------------------- reading

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every regular file under ``prefix`` (S3 semantics: a plain string prefix of the key;
        "dir/" lists a directory), in name order, without following symlinked directories."""
        head, _, rest = prefix.rpartition("/")
        top = self._path(head + "/" if head else "")
        try:
            entries = self._scan(top)
        except FileNotFoundError:
            return  # nothing written there yet
        except NotADirectoryError:
            return
        for entry in entries:
            if entry.name.startswith(rest):
                yield from self._walk_entry(entry, f"{head}/{entry.name}" if head else entry.name)

    def _scan(self, path: str) -> _Entries:
        try:
            with os.scandir(path) as it:
                return sorted(it, key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            raise
        except OSError as exc:
            raise storage_error(exc, f"listing {path}") from exc

    def _walk_entry(self, entry: os.DirEntry[str], key: str) -> Iterator[ObjectInfo]:
        try:
            if entry.is_dir(follow_symlinks=False):
                try:
                    children = self._scan(entry.path)
                except (FileNotFoundError, NotADirectoryError):
                    return  # removed while we listed
                for child in children:
                    yield from self._walk_entry(child, f"{key}/{child.name}")
                return
            if entry.is_symlink() and not self._contained(entry.path):
                return
            st = entry.stat(follow_symlinks=True)
            link = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            return  # removed (or a dangling symlink) while we listed
        except OSError as exc:
            raise storage_error(exc, f"listing {entry.path}") from exc
        if stat.S_ISREG(st.st_mode):
            yield _info(key, st, link)

    def _stat(self, key: str) -> os.stat_result | None:
        path = self._path(key)
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise storage_error(exc, f"stat {path}") from exc
        if not stat.S_ISREG(st.st_mode):
            return None
        if not self._contained(path):
            raise StorageError(f"{path} is a symlink out of the checkpoint root {self.root}", transient=False)
        return st

    def head(self, key: str, algorithm: ChecksumAlgorithm | None = None) -> ObjectInfo | None:
        st = self._stat(key)
        if st is None:
            return None
        try:
            link = os.lstat(self._path(key))
        except OSError:
            link = st
        return _info(key, st, link)

    def folders(self, prefix: str) -> tuple[_Infos, _Infos]:
        """The folders a checkpoint at ``prefix`` lies in, for origin checks: (the root and every
        folder down to the checkpoint's, the checkpoint's folder and every folder under it), with
        owner and mode, links not followed. Absent ones are left out."""
        parts = [p for p in prefix.split("/") if p]
        above = [
            _folder("/".join(parts[:i]), self._path("/".join(parts[:i]) + "/" if i else "")) for i in range(len(parts))
        ]
        top = self._path(prefix) if parts else self.root
        within = [_folder(prefix, top)]
        for base, dirs, _ in os.walk(top, followlinks=False):
            rel = os.path.relpath(base, self.root)
            within += [_folder(f"{rel}/{d}/", os.path.join(base, d)) for d in sorted(dirs)]
        return [f for f in above if f is not None], [f for f in within if f is not None]

    def read(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        if self._stat(key) is None:
            raise KeyError(key)
        path = self._path(key)
        try:
            f = open(path, "rb", buffering=0)  # noqa: SIM115 - closed by the generator
        except FileNotFoundError as exc:
            raise KeyError(key) from exc
        except OSError as exc:
            raise storage_error(exc, f"open {path}") from exc
        return self._chunks(f, path, chunk_size)

    @staticmethod
    def _chunks(f: io.FileIO, path: str, chunk_size: int) -> Iterator[bytes]:
        with f:
            try:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            except (AttributeError, OSError):
                pass  # advice only
            while True:
                try:
                    chunk = f.read(chunk_size)
                except OSError as exc:
                    raise storage_error(exc, f"reading {path}") from exc
                if not chunk:
                    return
                yield chunk

    def get_small(self, key: str, max_bytes: int = 16 << 20) -> bytes | None:
        st = self._stat(key)
        if st is None:
            return None
        if st.st_size > max_bytes:
            raise ValueError(f"{self._path(key)} is {st.st_size} bytes, more than the {max_bytes} allowed here")
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                data = f.read(max_bytes + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise storage_error(exc, f"reading {path}") from exc
        if len(data) > max_bytes:
            raise ValueError(f"{path} grew past the {max_bytes} bytes allowed here while it was read")
        return data

    # ---------------------------------------------------------------- writing

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        path = self._path(key)
        if path == self.root or key.endswith("/"):
            raise ValueError(f"object key {key!r} names a directory, not an object")
        directory, name = os.path.split(path)
        try:
            os.makedirs(directory, exist_ok=True)
            if not self._contained(directory):
                raise StorageError(f"{directory} is a symlink out of the checkpoint root {self.root}", transient=False)
            fd, tmp = _create_temp(directory, name)
        except OSError as exc:
            raise storage_error(exc, f"preparing to write {path}") from exc
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if if_absent:
                if not _link_new(tmp, path):
                    return False
            else:
                os.replace(tmp, path)
            _fsync_dir(directory)
            return True
        except OSError as exc:
            raise storage_error(exc, f"writing {path}") from exc
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass  # renamed into place
            except OSError:
                pass  # a leftover ".NAME.*.tmp" is harmless: never listed as a shard by the manifest


def _info(key: str, st: os.stat_result, link: os.stat_result) -> ObjectInfo:
    """A listed file: its owner is the link's own when someone other than the target's owner (or
    root) made the link, so a link planted by another account is seen as theirs."""
    owner = st.st_uid if link.st_uid in (0, st.st_uid) else link.st_uid
    return ObjectInfo(key, st.st_size, {}, None, st.st_mtime, owner, stat.S_IMODE(st.st_mode))


def _folder(key: str, path: str) -> ObjectInfo | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None  # gone, or not ours to see: the listing and the reads say what that means
    return ObjectInfo(key, 0, {}, None, st.st_mtime, st.st_uid, stat.S_IMODE(st.st_mode))


def _link_new(tmp: str, path: str) -> bool:
    """Hard-link ``tmp`` as ``path`` unless ``path`` exists (False then): a write that never replaces."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise StorageError(
                f"cannot write {path} without overwriting: the filesystem refused a hard link "
                f"({errno.errorcode.get(exc.errno or 0, exc.errno)}); checkpoint to a filesystem with "
                "hard links (Lustre, GPFS, NFS, ext4, xfs) or to S3",
                transient=False,
            ) from exc
        raise
    return True


def _create_temp(directory: str, name: str) -> tuple[int, str]:
    """A new file next to ``name``, created with mode 0666 less the umask like any file the trainer
    writes (``mkstemp``'s 0600 would hide the manifest from a supervisor running as another user)."""
    while True:
        tmp = os.path.join(directory, f".{name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), tmp
        except FileExistsError:
            continue


def _fsync_dir(directory: str) -> None:
    """Make the new name durable: fsync the directory (some filesystems refuse; that is fine)."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
