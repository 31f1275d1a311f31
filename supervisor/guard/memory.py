"""The guard's memory, in its own state directory (SQLite): the node changes it granted (what the
cluster-wide cap counts), the faults every instance proved on a node (the shared quarantine) and
admins' quarantine clears. One connection for the decisions, used under the guard's lock, and one
for the QUARANTINE reads, which do not wait for a decision (WAL: readers do not block the writer).
``version`` grows with every change of the faults or clears, so a reader knows its copy is stale.

Faults are kept per account and node (``uid:node``: a later one replaces the earlier), and one
account holds at most ``max_faults_per_uid`` of them within the quarantine's reach, so no caller
can grow the table, or every instance's QUARANTINE answer, beyond the nodes it really had out of
service (review 2026-12-02, finding 2)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from supervisor.domain.health.quarantine import Fault
from supervisor.guard.policy import Grant

SCHEMA = """
CREATE TABLE IF NOT EXISTS grants (at REAL NOT NULL, node TEXT NOT NULL, uid INTEGER NOT NULL,
                                   change TEXT NOT NULL, job INTEGER, job_nodes TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS grants_at ON grants(at);
CREATE TABLE IF NOT EXISTS faults (key TEXT PRIMARY KEY, node TEXT NOT NULL, at REAL NOT NULL,
                                   run TEXT NOT NULL, reason TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS faults_at ON faults(at);
CREATE TABLE IF NOT EXISTS clears (node TEXT PRIMARY KEY, at REAL NOT NULL, by TEXT NOT NULL);
"""
MAX_FAULTS_PER_UID = 4096  # nodes one account may have in the shared memory at once


class GuardMemory:
    def __init__(self, state_dir: Path) -> None:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._db = sqlite3.connect(state_dir / "guard.db", isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(SCHEMA)
        self._reads = sqlite3.connect(state_dir / "guard.db", isolation_level=None, check_same_thread=False)
        self._reading = threading.Lock()
        self.version = 0
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(faults)")}
        if "uid" not in columns:  # a guard.db from before faults were kept per account
            self._db.execute("ALTER TABLE faults ADD COLUMN uid INTEGER")
        self.max_faults_per_uid = MAX_FAULTS_PER_UID

    def close(self) -> None:
        self._reads.close()
        self._db.close()

    def record_grant(self, grant: Grant) -> None:
        self._db.execute(
            "INSERT INTO grants(at, node, uid, change, job, job_nodes) VALUES (?, ?, ?, ?, ?, ?)",
            (grant.at, grant.node, grant.uid, grant.change, grant.job, ",".join(grant.job_nodes)),
        )

    def grants(self, since: float) -> tuple[Grant, ...]:
        rows = self._db.execute("SELECT node, uid, change, at, job, job_nodes FROM grants WHERE at >= ?", (since,))
        return tuple(
            Grant(n, uid, c, at, job, tuple(filter(None, nodes.split(",")))) for n, uid, c, at, job, nodes in rows
        )

    def record_fault(self, fault: Fault, uid: int, since: float) -> bool:
        """Keep ``fault`` under its key (a later fault of the same key replaces the earlier one);
        False, and nothing kept, when it is a new key and ``uid`` already holds its maximum of
        faults at ``since`` or later (older ones, beyond the quarantine's reach, are forgotten)."""
        self._db.execute("DELETE FROM faults WHERE uid = ? AND at < ?", (uid, since))
        known = self._db.execute("SELECT 1 FROM faults WHERE key = ?", (fault.key,)).fetchone()
        if known is None and self._faults_of(uid) >= self.max_faults_per_uid:
            return False
        self._db.execute(
            "INSERT OR REPLACE INTO faults(key, node, at, run, reason, uid) VALUES (?, ?, ?, ?, ?, ?)",
            (fault.key, fault.node, fault.at, fault.run, fault.reason, uid),
        )
        self.version += 1
        return True

    def _faults_of(self, uid: int) -> int:
        (count,) = self._db.execute("SELECT COUNT(*) FROM faults WHERE uid = ?", (uid,)).fetchone()
        return int(count)

    def faults(self, since: float) -> list[Fault]:
        with self._reading:
            rows = self._reads.execute(
                "SELECT node, at, run, reason, key FROM faults WHERE at >= ? ORDER BY at", (since,)
            ).fetchall()
        return [Fault(node, at, run, reason, key, source="guard") for node, at, run, reason, key in rows]

    def clear(self, node: str, at: float, by: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO clears(node, at, by) VALUES (?, ?, ?)", (node, at, by))
        self.version += 1

    def clears(self) -> dict[str, float]:
        with self._reading:
            return dict(self._reads.execute("SELECT node, at FROM clears").fetchall())
