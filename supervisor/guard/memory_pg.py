"""The guard's memory shared by the guards of several login nodes (issue 33, item 3): the same
tables as ``memory.GuardMemory`` in one PostgreSQL database (``[store] url`` of guard.toml), so the
cluster-wide cap, the shared quarantine, the own-drain records and the maintenance reservations
hold across every guard, whichever login node a caller asks.

``deciding()`` is one transaction that first takes the guards' decision lock (a transaction-level
advisory lock): a decision's reads (the grants the cap counts, the node's own drain) and its writes
(the grant) are one step for all guards, as the one guard's lock makes them for itself — two
guards never both grant the cap's last drain. The reads of QUARANTINE use a second connection and
take no lock; ``version`` is a row every change of the faults or clears bumps in its transaction.

The database is the guard's own (its role, its password; docs/guard.md): the accounts whose
requests it judges must not reach it, or they could write their own grants. A database that does
not answer is ``MemoryUnreachable``: the request is refused as transient and nothing decided.

One thing is not atomic with Slurm: a node change is made in Slurm, then its grant is committed;
should the database fail between the two, the change stands in Slurm without its grant (the next
decisions undercount by one until the window passes). The change is Slurm's, made first, because
a grant recorded for a change Slurm refused would count against the cap forever."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import TupleRow, tuple_row

from supervisor.adapters.postgres.base import StoreUnreachable, connect, safe_url
from supervisor.domain.health.quarantine import Fault
from supervisor.guard.memory import MAX_FAULTS_PER_UID, MemoryUnreachable
from supervisor.guard.policy import Grant, Reservation

SCHEMA = """
CREATE TABLE IF NOT EXISTS guard_grants (id BIGSERIAL PRIMARY KEY, at DOUBLE PRECISION NOT NULL,
    node TEXT NOT NULL, uid BIGINT NOT NULL, change TEXT NOT NULL, job BIGINT, job_nodes TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS guard_grants_at ON guard_grants(at);
CREATE INDEX IF NOT EXISTS guard_grants_node ON guard_grants(node, at);
CREATE TABLE IF NOT EXISTS guard_faults (key TEXT PRIMARY KEY, node TEXT NOT NULL, at DOUBLE PRECISION NOT NULL,
    run TEXT NOT NULL, reason TEXT NOT NULL, uid BIGINT NOT NULL);
CREATE INDEX IF NOT EXISTS guard_faults_at ON guard_faults(at);
CREATE INDEX IF NOT EXISTS guard_faults_uid ON guard_faults(uid, at);
CREATE TABLE IF NOT EXISTS guard_clears (node TEXT PRIMARY KEY, at DOUBLE PRECISION NOT NULL, by TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS guard_reservations (node TEXT PRIMARY KEY, uid BIGINT NOT NULL, name TEXT NOT NULL,
    at DOUBLE PRECISION NOT NULL, until DOUBLE PRECISION NOT NULL);
CREATE TABLE IF NOT EXISTS guard_version (one INTEGER PRIMARY KEY CHECK (one = 1), n BIGINT NOT NULL);
INSERT INTO guard_version VALUES (1, 0) ON CONFLICT DO NOTHING;
"""
DECISION_LOCK = 0x5353_5647  # "SSVG": the guards' decision lock (pg_advisory_xact_lock)
DECISION_IDLE_S = 30  # the server ends a decision left idle this long (a guard cut off mid-decision)
LOCK_WAIT_S = 10  # how long a guard waits for another guard's decision
SETUP_LOCK = DECISION_LOCK + 1  # two guards starting at once create the tables one after the other

Connection = psycopg.Connection[TupleRow]


class SharedGuardMemory:
    def __init__(self, url: str, password: str | None = None, *, connect_timeout_s: float = 10.0) -> None:
        self.url = safe_url(url)
        self._connect: Callable[[], Connection] = lambda: _tuples(connect(url, password, connect_timeout_s))
        self._db: Connection | None = None
        self._reads: Connection | None = None
        self._reading = threading.Lock()
        self.max_faults_per_uid = MAX_FAULTS_PER_UID
        with self._mapped(), self._conn().transaction():
            self._conn().execute("SELECT pg_advisory_xact_lock(%s)", (SETUP_LOCK,))
            self._conn().execute(SCHEMA)

    # ------------------------------------------------------------------ connections

    def _conn(self) -> Connection:
        if self._db is None or self._db.closed:
            self._db = self._connect()
        return self._db

    def _read_conn(self) -> Connection:
        if self._reads is None or self._reads.closed:
            self._reads = self._connect()
        return self._reads

    @contextmanager
    def _mapped(self) -> Iterator[None]:
        """The database's silence as ``MemoryUnreachable`` (the next use connects again)."""
        try:
            yield
        except (StoreUnreachable, psycopg.OperationalError) as exc:
            for conn in (self._db, self._reads):
                if conn is not None and conn.broken:
                    conn.close()
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise MemoryUnreachable(
                f"the guard's shared memory {self.url} did not answer: {first}", delay=2.0
            ) from None

    def close(self) -> None:
        for conn in (self._db, self._reads):
            if conn is not None:
                conn.close()

    @contextmanager
    def deciding(self) -> Iterator[None]:
        """One decision: one transaction, after every other guard's decision (the lock)."""
        with self._mapped(), self._conn().transaction():
            self._conn().execute("SELECT pg_advisory_xact_lock(%s)", (DECISION_LOCK,))
            yield

    def _exec(self, sql: str, args: tuple[Any, ...] = ()) -> psycopg.Cursor[TupleRow]:
        with self._mapped():
            return self._conn().execute(sql, args)

    def _bump(self) -> None:
        self._exec("UPDATE guard_version SET n = n + 1 WHERE one = 1")

    # ------------------------------------------------------------------ what the cap counts

    def record_grant(self, grant: Grant) -> None:
        self._exec(
            "INSERT INTO guard_grants(at, node, uid, change, job, job_nodes) VALUES (%s, %s, %s, %s, %s, %s)",
            (grant.at, grant.node, grant.uid, grant.change, grant.job, ",".join(grant.job_nodes)),
        )

    def grants(self, since: float) -> tuple[Grant, ...]:
        rows = self._exec(
            "SELECT node, uid, change, at, job, job_nodes FROM guard_grants WHERE at >= %s ORDER BY id", (since,)
        )
        return tuple(_grant(row) for row in rows.fetchall())

    def own_drain(self, node: str) -> Grant | None:
        """As ``GuardMemory.own_drain``: the node's latest DOWN or DRAIN unless a RESUME or a clear
        came after it."""
        row = self._exec(
            "SELECT node, uid, change, at, job, job_nodes FROM guard_grants WHERE node = %s ORDER BY at DESC, id DESC LIMIT 1",
            (node,),
        ).fetchone()
        if row is None or row[2] not in ("DOWN", "DRAIN"):
            return None
        cleared = self._exec("SELECT at FROM guard_clears WHERE node = %s", (node,)).fetchone()
        if cleared is not None and cleared[0] >= row[3]:
            return None
        return _grant(row)

    # ------------------------------------------------------------------ reservations

    def reservation(self, node: str) -> Reservation | None:
        row = self._exec(
            "SELECT node, uid, name, at, until FROM guard_reservations WHERE node = %s", (node,)
        ).fetchone()
        return Reservation(*row) if row is not None else None

    def record_reservation(self, r: Reservation) -> None:
        self._exec(
            "INSERT INTO guard_reservations(node, uid, name, at, until) VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT (node) DO UPDATE SET uid = excluded.uid, name = excluded.name, at = excluded.at, "
            "until = excluded.until",
            (r.node, r.uid, r.name, r.at, r.until),
        )

    def drop_reservation(self, node: str) -> None:
        self._exec("DELETE FROM guard_reservations WHERE node = %s", (node,))

    # ------------------------------------------------------------------ the shared quarantine

    @property
    def version(self) -> int:
        with self._reading, self._mapped():
            row = self._read_conn().execute("SELECT n FROM guard_version WHERE one = 1").fetchone()
        return int(row[0]) if row is not None else 0

    def forgive(self, uid: int, node: str) -> None:
        self._exec("DELETE FROM guard_faults WHERE key = %s", (f"{uid}:{node}",))
        self._bump()

    def record_fault(self, fault: Fault, uid: int, since: float) -> bool:
        """As ``GuardMemory.record_fault``: one fault per key, at most ``max_faults_per_uid`` keys
        per account within the quarantine's reach."""
        self._exec("DELETE FROM guard_faults WHERE uid = %s AND at < %s", (uid, since))
        known = self._exec("SELECT 1 FROM guard_faults WHERE key = %s", (fault.key,)).fetchone()
        if known is None and self._faults_of(uid) >= self.max_faults_per_uid:
            return False
        self._exec(
            "INSERT INTO guard_faults(key, node, at, run, reason, uid) VALUES (%s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (key) DO UPDATE SET node = excluded.node, at = excluded.at, run = excluded.run, "
            "reason = excluded.reason, uid = excluded.uid",
            (fault.key, fault.node, fault.at, fault.run, fault.reason, uid),
        )
        self._bump()
        return True

    def _faults_of(self, uid: int) -> int:
        row = self._exec("SELECT COUNT(*) FROM guard_faults WHERE uid = %s", (uid,)).fetchone()
        return int(row[0]) if row is not None else 0

    def faults(self, since: float) -> list[Fault]:
        with self._reading, self._mapped():
            rows = (
                self._read_conn()
                .execute("SELECT node, at, run, reason, key FROM guard_faults WHERE at >= %s ORDER BY at", (since,))
                .fetchall()
            )
        return [Fault(node, at, run, reason, key, source="guard") for node, at, run, reason, key in rows]

    def clear(self, node: str, at: float, by: str) -> None:
        self._exec(
            "INSERT INTO guard_clears(node, at, by) VALUES (%s, %s, %s) "
            "ON CONFLICT (node) DO UPDATE SET at = excluded.at, by = excluded.by",
            (node, at, by),
        )
        self._bump()

    def clears(self) -> dict[str, float]:
        with self._reading, self._mapped():
            rows = self._read_conn().execute("SELECT node, at FROM guard_clears").fetchall()
        return dict(rows)


def _tuples(conn: psycopg.Connection[Any]) -> Connection:
    """The store's connection (bounded waits, no NUL sent, no secret in errors), rows as tuples.
    A decision's transaction waits on Slurm between its statements (one squeue or scontrol at a
    time, each at most the guard's command timeout, 5 s by default), so the server may keep it idle
    longer than the store's 5 s; a guard waiting for another's decision gives up after 10 s (its
    caller's own timeout is 15 s) and answers memory-unreachable instead of hanging."""
    conn.row_factory = tuple_row
    conn.execute(f"SET idle_in_transaction_session_timeout = '{DECISION_IDLE_S}s'")
    conn.execute(f"SET lock_timeout = '{LOCK_WAIT_S}s'")
    return conn


def _grant(row: TupleRow) -> Grant:
    node, uid, change, at, job, nodes = row
    return Grant(node, uid, change, at, job, tuple(filter(None, nodes.split(","))))
