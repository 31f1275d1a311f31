"""The connection every table of the store shares: one per daemon, WAL, short transactions.

One connection per daemon; every write is one short transaction, so a crash between any two
statements leaves a consistent database. Readers in other processes (the page renderer) open it
read-only and never migrate it.
"""

from __future__ import annotations

import sqlite3
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

from supervisor.adapters.sqlite import fence
from supervisor.adapters.sqlite.local_fs import refuse_network_filesystem
from supervisor.adapters.sqlite.schema import migrate, require_current

DB_NAME = "supervisor.db"
T = TypeVar("T")


class SqliteBase:
    """The store's connection: the daemon's (``read_only=False``: created if absent, WAL, migrated)
    or a reader's (``read_only=True``, the page renderer: SQLite's ``mode=ro``, never created,
    migrated or written; a schema other than this code's raises ``SchemaMismatch``).
    ``durable=False`` (the simulator's throwaway logbook): commits are not synced to disk, so a
    power cut may lose the newest ones; the daemon's store is always durable."""

    def __init__(self, state_dir: str | Path, *, read_only: bool = False, durable: bool = True) -> None:
        self.path = Path(state_dir) / DB_NAME
        self._held_epoch: int | None = None  # the leader epoch this connection's writes carry (``fence``)
        self._db = _open_read_only(self.path) if read_only else _open_writable(self.path, durable)
        if not read_only:  # by a weak reference: no cycle, so a store dropped unclosed still closes at once
            fence.install(self._db, _held_epoch_of(weakref.ref(self)))
        self.instance_id: str = self._db.execute("SELECT value FROM meta WHERE key = 'instance'").fetchone()[0]
        self._writes: dict[str, int] = {}  # table -> this connection's writes to it (see ``_kept_read``)
        self._kept: dict[str, tuple[tuple[int, int], Any]] = {}

    def close(self) -> None:
        self._db.close()

    def _wrote(self, table: str) -> None:
        self._writes[table] = self._writes.get(table, 0) + 1

    def _kept_read(self, table: str, read: Callable[[], T]) -> T:
        """``read()`` of ``table``, kept until this connection writes the table again (its writers
        call ``_wrote``) or another connection commits (SQLite's ``data_version``): the engine
        reads some tables several times a tick and writes them a few times a day. Never kept
        inside a transaction (it may roll back)."""
        if self._db.in_transaction:
            return read()
        version = (self._db.execute("PRAGMA data_version").fetchone()[0], self._writes.get(table, 0))
        kept = self._kept.get(table)
        if kept is not None and kept[0] == version:
            return cast(T, kept[1])
        value = read()
        self._kept[table] = (version, value)
        return value

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        if self._db.in_transaction:
            yield self._db
            return
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")


def _held_epoch_of(store: weakref.ReferenceType[SqliteBase]) -> Callable[[], int | None]:
    def held() -> int | None:
        alive = store()
        return alive._held_epoch if alive is not None else None

    return held


def _open_writable(path: Path, durable: bool = True) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    refuse_network_filesystem(path.parent)  # WAL needs one host's shared memory and locks
    db = sqlite3.connect(
        path, isolation_level=None, timeout=10.0, check_same_thread=False, factory=fence.FencedConnection
    )
    db.row_factory = sqlite3.Row
    _enable_wal(db)
    db.execute("PRAGMA synchronous=FULL" if durable else "PRAGMA synchronous=OFF")
    db.execute("PRAGMA foreign_keys=ON")
    migrate(db)
    return db


def _open_read_only(path: Path) -> sqlite3.Connection:
    """The file opened O_RDONLY (``mode=ro``; the URI escapes odd characters in the path), and
    ``query_only`` on top, so no statement of a reader's can write whatever the file's mode."""
    uri = f"{path.absolute().as_uri()}?mode=ro"
    db = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=10.0, check_same_thread=False)
    try:
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA query_only=ON")
        require_current(db)
    except BaseException:
        db.close()
        raise
    return db


def _enable_wal(db: sqlite3.Connection, patience_s: float = 10.0) -> None:
    """Switch to WAL. Switching takes an exclusive lock and SQLite does not wait for it (the busy
    timeout does not apply): while another process creates or migrates the database — the daemon
    starting as `slurm-supervisor submit` runs — it answers "database is locked" at once. Retry."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.05)
