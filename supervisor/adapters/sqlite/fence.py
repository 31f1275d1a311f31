"""Fencing in SQLite: every write of a connection carries the epoch it holds, and is refused when
the leader lease (table ``leader``) has a newer one (issue 33, ``domain.lease``).

One trigger per table and kind of write (TEMP: this connection's alone, other connections and
tools are untouched), created when the connection opens. Each compares the connection's epoch
(``ssv_held_epoch()``, a function of this connection that reads the store object's field) with the
lease's inside the writing statement itself, so the check and the write are one: a conditional
write, not a check-then-act. A connection that holds no epoch (None: one daemon without a lease,
the CLI's tools) is never refused. The leader table itself is not fenced: a standby's claim
writes it.

The refusal is SQLite's ``RAISE(ABORT)``; ``FencedConnection`` turns it into ``NotLeading``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from typing import Any

from supervisor.ports import NotLeading

REFUSED = "ssv-fenced: a newer leader epoch holds the store"
UNFENCED = frozenset({"leader", "sqlite_sequence"})
_TRIGGER = (
    'CREATE TEMP TRIGGER IF NOT EXISTS "fence_{table}_{name}" BEFORE {write} ON main."{table}"'
    " WHEN ssv_held_epoch() IS NOT NULL"
    " AND ssv_held_epoch() < (SELECT COALESCE(MAX(epoch), 0) FROM main.leader)"
    " BEGIN SELECT RAISE(ABORT, '{refused}'); END"
)


class FencedConnection(sqlite3.Connection):
    """A connection whose fenced writes raise ``NotLeading`` (a ``TransientError``: the engine's
    tick ends as after any outage, and the loop finds it no longer leads)."""

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        try:
            return super().execute(sql, parameters)
        except sqlite3.IntegrityError as exc:
            raise _refused(exc) from None

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> sqlite3.Cursor:
        try:
            return super().executemany(sql, parameters)
        except sqlite3.IntegrityError as exc:
            raise _refused(exc) from None


def _refused(exc: sqlite3.IntegrityError) -> Exception:
    if REFUSED in str(exc):
        return NotLeading("this daemon's epoch is older than the lease's: the write is refused")
    return exc


def install(db: sqlite3.Connection, held_epoch: Callable[[], int | None]) -> None:
    """The fence on every table of ``db``'s main schema (call after the migration)."""
    db.create_function("ssv_held_epoch", 0, held_epoch)
    tables = [r[0] for r in db.execute("SELECT name FROM main.sqlite_master WHERE type = 'table'")]
    for table in tables:
        if table in UNFENCED:
            continue
        for write in ("INSERT", "UPDATE", "DELETE"):  # table names are the schema's own, not input
            db.execute(_TRIGGER.format(table=table, write=write, name=write.lower(), refused=REFUSED))
