"""The leader lease in SQLite (``ports.LeaderLease``, the rule in ``domain.lease``).

One machine holds an SQLite store, so its clock is the database's; the lease is claimed in one
``BEGIN IMMEDIATE`` transaction (SQLite's write lock: claims and fenced writes take turns)."""

from __future__ import annotations

import sqlite3

from supervisor.adapters.sqlite.base import SqliteBase
from supervisor.domain.lease import Lease, LeaseRow, claimed

_NOW = "SELECT (julianday('now') - 2440587.5) * 86400.0"


class SqliteLease(SqliteBase):
    def claim_lease(self, holder: str, address: str, lease_s: float) -> Lease:
        with self.transaction() as db:
            now = float(db.execute(_NOW).fetchone()[0])
            current = _row(db)
            row = claimed(current, holder, address, now, lease_s)
            if row is not None:
                db.execute(
                    "INSERT INTO leader(id, holder, address, epoch, since, expires) VALUES (1, ?, ?, ?, ?, ?)"
                    " ON CONFLICT(id) DO UPDATE SET holder = excluded.holder, address = excluded.address,"
                    " epoch = excluded.epoch, since = excluded.since, expires = excluded.expires",
                    (row.holder, row.address, row.epoch, row.since, row.expires),
                )
        found = row or current
        assert found is not None, "a claim of an empty lease takes it"
        return found.seen_at(now)

    def release_lease(self, holder: str) -> None:
        self._db.execute(f"UPDATE leader SET expires = ({_NOW}) WHERE holder = ?", (holder,))  # noqa: S608

    def lease(self) -> Lease | None:
        now = float(self._db.execute(_NOW).fetchone()[0])
        row = _row(self._db)
        return row.seen_at(now) if row is not None else None

    def hold_epoch(self, epoch: int | None) -> None:
        self._held_epoch = epoch


def _row(db: sqlite3.Connection) -> LeaseRow | None:
    r = db.execute("SELECT holder, address, epoch, since, expires FROM leader WHERE id = 1").fetchone()
    if r is None:
        return None
    return LeaseRow(str(r[0]), str(r[1]), int(r[2]), float(r[3]), float(r[4]))
