"""The connection every table of the PostgreSQL store shares: one per store object, short transactions.

The transaction semantics are SQLite's (``adapters.sqlite.base``), so the engine cannot tell the
stores apart: a statement outside a ``transaction()`` block is its own transaction (autocommit);
a block is one transaction, all of its writes or none; a block opened inside an open one joins it
(no savepoint: the inner block commits nothing by itself, and its failure undoes the whole).
Every block begins by taking the store's writer lock (a transaction-level advisory lock), as
SQLite's ``BEGIN IMMEDIATE`` takes its write lock: the daemon's connections (the engine's, the
API's, the ingest's) write one block at a time, so a read-then-write block (the next attempt's
number, a run registered once) sees no other block's half.

Every write of the store's families goes through ``_write`` (a block of its own, or the open
one), and every block begins in ``_begin``: after the writer lock, the fencing check of the leader
lease (issue 33, ``domain.lease``): a connection that holds an epoch (``hold_epoch``) writes only
while the lease's epoch is not newer, checked inside the transaction of the write it guards. The
lease's claim takes the same writer lock, so a claim and a fenced block never interleave: a new
epoch begins only after every block of the old one committed or rolled back.

A database that does not answer mid-run (a connection lost, a server restarting) is a
``StoreUnreachable`` (a ``TransientError``: the engine's tick ends as after a Slurm outage, and
nothing half-written is kept — the block rolled back); the next use opens a new connection.

The password is handed to libpq as a connection parameter, never in the URL, on argv or in a
log line; errors name the URL without it (``safe_url``).
"""

from __future__ import annotations

import select
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import structlog
from psycopg import pq
from psycopg.abc import Buffer
from psycopg.rows import DictRow, dict_row
from psycopg.types.string import StrBinaryDumper, StrDumperUnknown

from supervisor.adapters.postgres.schema import WRITER_LOCK, migrate, require_current
from supervisor.ports import NotLeading, TransientError

log = structlog.get_logger(__name__)

Connection = psycopg.Connection[DictRow]


# No wait on the database is unbounded, whatever the network does (issue 33, item 5): a request whose
# packets are dropped fails after tcp_user_timeout (the connect timeout), an answer that never comes
# after the keepalives (5 + 3 x 2 s); and the server ends a transaction whose client went silent
# (idle_in_transaction_session_timeout), so a partitioned leader's open block cannot hold the
# writer lock — and with it every standby's claim — beyond a few seconds. Blocks never wait inside.
BOUNDED_WAITS: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "options": "-c idle_in_transaction_session_timeout=5000",
}


class StoreUnreachable(TransientError):
    """The database did not answer or refused the connection (the message names no secret)."""


class PostgresBase:
    """The store's connection: the daemon's (``read_only=False``: migrated to this code's schema
    on open) or a reader's (``read_only=True``: every transaction
    read-only, never migrated; a schema other than this code's raises ``SchemaMismatch``)."""

    def __init__(
        self,
        url: str,
        *,
        password: str | None = None,
        read_only: bool = False,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.url = safe_url(url)
        self._reconnect: Callable[[], Connection] = lambda: connect(url, password, connect_timeout_s)
        self._conn = self._reconnect()
        self._read_only = read_only
        self._in_block = False
        self._held_epoch: int | None = None  # the leader epoch this connection's writes carry
        try:
            self._prepare(read_only)
        except BaseException:
            self._db.close()
            raise
        row = self._one("SELECT value FROM meta WHERE key = 'instance'", ())
        assert row is not None, "migration 1 writes the instance id"
        self.instance_id: str = str(row["value"])

    def _prepare(self, read_only: bool) -> None:
        if read_only:
            self._db.execute("SET default_transaction_read_only = on")
            require_current(self._db)
        else:
            migrate(self._db)

    def close(self) -> None:
        self._conn.close()

    @property
    def _db(self) -> Connection:
        """The connection; a new one when the last was lost (never inside a block: it rolled back).
        An idle connection the server ended (a restart, ``pg_terminate_backend``) is found here,
        before a statement would fail on it: the server's farewell waits unread on its socket."""
        if not self._in_block and (self._conn.closed or self._conn.broken or _ended_while_idle(self._conn)):
            self._conn.close()
            self._conn = self._reconnect()
            if self._read_only:
                self._conn.execute("SET default_transaction_read_only = on")
        return self._conn

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        with self._block(fenced=True) as db:
            yield db

    @contextmanager
    def _block(self, *, fenced: bool) -> Iterator[Connection]:
        if self._in_block:
            yield self._db
            return
        try:
            with self._db.transaction():
                self._begin(fenced)
                self._in_block = True
                try:
                    yield self._db
                finally:
                    self._in_block = False
        except psycopg.OperationalError as exc:
            raise unreachable(self.url, exc) from None

    def _begin(self, fenced: bool = True) -> None:
        """The first statements of every transaction this store opens: the writer lock, then the
        fence (when this connection holds an epoch and the block is not the lease's own claim)."""
        self._db.execute("SELECT pg_advisory_xact_lock(%s)", (WRITER_LOCK,))
        if not fenced or self._held_epoch is None:
            return
        row = self._db.execute("SELECT epoch FROM leader WHERE id = 1").fetchone()
        if row is not None and int(row["epoch"]) > self._held_epoch:
            raise NotLeading(
                f"this daemon's epoch {self._held_epoch} is older than the lease's {row['epoch']}: the write is refused"
            )

    def hold_epoch(self, epoch: int | None) -> None:
        self._held_epoch = epoch

    # ------------------------------------------------------------------ statements

    def _one(self, sql: Any, args: Sequence[Any]) -> DictRow | None:
        return self._db.execute(sql, args).fetchone()

    def _all(self, sql: Any, args: Sequence[Any]) -> list[DictRow]:
        return self._db.execute(sql, args).fetchall()

    def _write(self, sql: Any, args: Sequence[Any]) -> int:
        """One writing statement, in a transaction (its own or the open one); the rows it changed."""
        with self.transaction() as db:
            return db.execute(sql, args).rowcount

    def _write_many(self, sql: Any, rows: Sequence[Sequence[Any]]) -> None:
        with self.transaction() as db, db.cursor() as cur:
            cur.executemany(sql, rows)


def _ended_while_idle(conn: Connection) -> bool:
    """Anything to read on an idle connection in autocommit is the server's closing message (this
    store listens to no notifications): one poll of the socket, no round trip."""
    if conn.info.transaction_status != pq.TransactionStatus.IDLE:
        return False
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def migrate_database(url: str, password: str | None, timeout_s: float = 10.0) -> int:
    """Bring the database to this code's schema (``schema.migrate``); the version it had before."""
    with connect(url, password, timeout_s) as db:
        return migrate(db)


def connect(url: str, password: str | None, timeout_s: float) -> Connection:
    """A connection in autocommit (blocks open transactions explicitly), rows as dicts."""
    params: dict[str, Any] = {
        "connect_timeout": max(1, round(timeout_s)),
        "application_name": "slurm-supervisor",
        **BOUNDED_WAITS,
        "tcp_user_timeout": round(timeout_s * 1000),
    }
    if password is not None:
        params["password"] = password
    try:
        conn = MappedConnection.connect(url, autocommit=True, row_factory=dict_row, **params)
    except psycopg.Error as exc:
        raise StoreUnreachable(f"cannot connect to the store {safe_url(url)}: {_first_line(exc)}", delay=5.0) from None
    conn.adapters.register_dumper(str, _NulFreeBinary)
    conn.adapters.register_dumper(str, _NulFreeText)  # last: the default, as psycopg's own
    return conn


class _NulFreeText(StrDumperUnknown):
    """Every text sent: PostgreSQL refuses U+0000 in text (SQLite keeps it), and one NUL from
    Slurm's output or a node's reason would fail the whole write, every tick: kept as U+FFFD."""

    def dump(self, obj: str) -> Buffer | None:
        return super().dump(obj.replace("\x00", "\ufffd"))


class _NulFreeBinary(StrBinaryDumper):
    def dump(self, obj: str) -> Buffer | None:
        return super().dump(obj.replace("\x00", "\ufffd"))


class MappedConnection(psycopg.Connection[DictRow]):
    """A connection whose lost server (``OperationalError``: connection closed, server shutting
    down, a timeout) is a ``StoreUnreachable`` at every statement, not psycopg's own error."""

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().execute(*args, **kwargs)
        except psycopg.OperationalError as exc:
            raise unreachable(safe_url(self.info.dsn), exc) from None


def unreachable(url: str, exc: BaseException) -> StoreUnreachable:
    return StoreUnreachable(f"the store {url} did not answer: {_first_line(exc)}", delay=2.0)


def safe_url(url: str) -> str:
    """The URL with any password in it replaced by ``***`` (for messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
