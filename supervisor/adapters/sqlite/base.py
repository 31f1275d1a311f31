"""The connection every table of the store shares: one per daemon, WAL, short transactions.

One connection per daemon; every write is one short transaction, so a crash between any two
statements leaves a consistent database.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from supervisor.adapters.sqlite.schema import migrate

DB_NAME = "supervisor.db"


class SqliteBase:
    def __init__(self, state_dir: str | Path) -> None:
        self.path = Path(state_dir) / DB_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, timeout=10.0, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        _enable_wal(self._db)
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        migrate(self._db)
        self.instance_id: str = self._db.execute("SELECT value FROM meta WHERE key = 'instance'").fetchone()[0]

    def close(self) -> None:
        self._db.close()

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
