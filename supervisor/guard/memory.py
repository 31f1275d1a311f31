"""The guard's memory, in its own state directory (SQLite): the node changes it granted (what the
cluster-wide cap counts), the faults every instance proved on a node (the shared quarantine) and
admins' quarantine clears. One connection for the decisions, used under the guard's lock, and one
for the QUARANTINE reads, which do not wait for a decision (WAL: readers do not block the writer).
``version`` grows with every change of the faults or clears, so a reader knows its copy is stale.

Faults are kept per account and node (``uid:node``: a later one replaces the earlier), and one
account holds at most ``max_faults_per_uid`` of them within the quarantine's reach, so no caller
can grow the table, or every instance's QUARANTINE answer, beyond the nodes it really had out of
service (review 2026-12-02, finding 2).

The remedies (remedy.py) read two more things here: the node's latest DOWN or DRAIN through the
guard (``own_drain``: a RESUME or an admin's clear after it ends it), and the maintenance
reservations the guard made (``reservations``: one per node, with its owner's UID).

``Memory`` is what the guard needs of it; guards on several login nodes share one in PostgreSQL
(memory_pg.py, issue 33 item 3), where ``deciding()`` makes one decision at a time across all of
them. Here, in one guard's own file, the guard's lock already does."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Protocol

from supervisor.domain.health.quarantine import Fault
from supervisor.guard.policy import Grant, Reservation
from supervisor.ports import TransientError

SCHEMA = """
CREATE TABLE IF NOT EXISTS grants (at REAL NOT NULL, node TEXT NOT NULL, uid INTEGER NOT NULL,
                                   change TEXT NOT NULL, job INTEGER, job_nodes TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS grants_at ON grants(at);
CREATE TABLE IF NOT EXISTS faults (key TEXT PRIMARY KEY, node TEXT NOT NULL, at REAL NOT NULL,
                                   run TEXT NOT NULL, reason TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS faults_at ON faults(at);
CREATE TABLE IF NOT EXISTS clears (node TEXT PRIMARY KEY, at REAL NOT NULL, by TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS grants_node ON grants(node, at);
CREATE TABLE IF NOT EXISTS reservations (node TEXT PRIMARY KEY, uid INTEGER NOT NULL, name TEXT NOT NULL,
                                         at REAL NOT NULL, until REAL NOT NULL);
"""
MAX_FAULTS_PER_UID = 4096  # nodes one account may have in the shared memory at once


class MemoryUnreachable(TransientError):
    """A shared memory's database did not answer: the request is refused, nothing decided."""


class Memory(Protocol):
    """The guard's memory, in its own file (``GuardMemory``) or shared by several guards
    (``memory_pg.SharedGuardMemory``)."""

    max_faults_per_uid: int

    @property
    def version(self) -> int: ...  # grows with every change of the faults or clears

    def deciding(self) -> AbstractContextManager[None]: ...
    def close(self) -> None: ...
    def record_grant(self, grant: Grant) -> None: ...
    def grants(self, since: float) -> tuple[Grant, ...]: ...
    def own_drain(self, node: str) -> Grant | None: ...
    def reservation(self, node: str) -> Reservation | None: ...
    def record_reservation(self, r: Reservation) -> None: ...
    def drop_reservation(self, node: str) -> None: ...
    def forgive(self, uid: int, node: str) -> None: ...
    def record_fault(self, fault: Fault, uid: int, since: float) -> bool: ...
    def faults(self, since: float) -> list[Fault]: ...
    def clear(self, node: str, at: float, by: str) -> None: ...
    def clears(self) -> dict[str, float]: ...


class GuardMemory:
    def __init__(self, state_dir: Path) -> None:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._db = sqlite3.connect(state_dir / "guard.db", isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(SCHEMA)
        self._reads = sqlite3.connect(state_dir / "guard.db", isolation_level=None, check_same_thread=False)
        self._reading = threading.Lock()
        self._version = 0
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(faults)")}
        if "uid" not in columns:  # a guard.db from before faults were kept per account
            self._db.execute("ALTER TABLE faults ADD COLUMN uid INTEGER")
        self.max_faults_per_uid = MAX_FAULTS_PER_UID

    @property
    def version(self) -> int:
        return self._version

    @contextmanager
    def deciding(self) -> Iterator[None]:
        """One decision's reads and writes: the guard's own lock already makes it the only one."""
        yield

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

    def own_drain(self, node: str) -> Grant | None:
        """The node's latest DOWN or DRAIN through the guard, unless a RESUME (a grant too) or a
        clear came after it."""
        row = self._db.execute(
            "SELECT node, uid, change, at, job, job_nodes FROM grants WHERE node = ? ORDER BY at DESC, rowid DESC LIMIT 1",
            (node,),
        ).fetchone()
        if row is None or row[2] not in ("DOWN", "DRAIN"):
            return None
        cleared = self._db.execute("SELECT at FROM clears WHERE node = ?", (node,)).fetchone()
        if cleared is not None and cleared[0] >= row[3]:
            return None
        n, uid, change, at, job, nodes = row
        return Grant(n, uid, change, at, job, tuple(filter(None, nodes.split(","))))

    def reservation(self, node: str) -> Reservation | None:
        row = self._db.execute("SELECT node, uid, name, at, until FROM reservations WHERE node = ?", (node,)).fetchone()
        return Reservation(*row) if row is not None else None

    def record_reservation(self, r: Reservation) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO reservations(node, uid, name, at, until) VALUES (?, ?, ?, ?, ?)",
            (r.node, r.uid, r.name, r.at, r.until),
        )

    def drop_reservation(self, node: str) -> None:
        self._db.execute("DELETE FROM reservations WHERE node = ?", (node,))

    def forgive(self, uid: int, node: str) -> None:
        """Forget one account's fault of the node (its own, after the node passed its validation)."""
        self._db.execute("DELETE FROM faults WHERE key = ?", (f"{uid}:{node}",))
        self._version += 1

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
        self._version += 1
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
        self._version += 1

    def clears(self) -> dict[str, float]:
        with self._reading:
            return dict(self._reads.execute("SELECT node, at FROM clears").fetchall())
