"""The logbook: append-only events for people. Recording the same key twice stores it once."""

from __future__ import annotations

import json
from typing import Any, cast

from supervisor.adapters.sqlite.base import SqliteBase
from supervisor.adapters.store_rows import event_from_row as _event_from_row
from supervisor.domain.records import Event, EventKind


class SqliteLogbook(SqliteBase):
    def record_event(self, e: Event) -> bool:
        """Append an event unless one with the same key exists. True when it was new."""
        cur = self._db.execute(
            "INSERT OR IGNORE INTO events(at, run, attempt, job_id, kind, message, evidence, actor, key)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                e.at,
                e.run,
                e.attempt,
                e.job_id,
                e.kind.value,
                e.message,
                json.dumps(e.evidence, default=str),
                e.actor,
                e.key,
            ),
        )
        return cur.rowcount == 1

    def events_of(self, run: str, kinds: tuple[EventKind, ...], limit: int | None = None) -> list[Event]:
        """The run's events of these kinds, oldest first; only the newest ``limit`` when given."""
        marks = ", ".join("?" for _ in kinds)
        rows = self._db.execute(
            f"SELECT * FROM events WHERE run = ? AND kind IN ({marks}) ORDER BY id DESC LIMIT ?",  # noqa: S608 - placeholders only
            (run, *[k.value for k in kinds], -1 if limit is None else limit),
        ).fetchall()
        return [_event_from_row(r) for r in reversed(rows)]

    def last_event(self, run: str, kinds: tuple[EventKind, ...]) -> Event | None:
        marks = ", ".join("?" for _ in kinds)
        row = self._db.execute(
            f"SELECT * FROM events WHERE run = ? AND kind IN ({marks}) ORDER BY id DESC LIMIT 1",  # noqa: S608 - placeholders only
            (run, *[k.value for k in kinds]),
        ).fetchone()
        return None if row is None else _event_from_row(row)

    def last_event_id(self) -> int:
        """The number of the newest event (0 when there is none): a reader starts after it."""
        return int(self._db.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0])

    def events_after(self, after_id: int, limit: int = 1000) -> tuple[int, list[Event]]:
        """At most ``limit`` events recorded after the one numbered ``after_id``, in the order they
        were recorded, and the number of the last one (``after_id`` when there is none): a reader
        that keeps it reads each event once, however long the logbook grows."""
        rows = self._db.execute("SELECT * FROM events WHERE id > ? ORDER BY id LIMIT ?", (after_id, limit)).fetchall()
        return (rows[-1]["id"] if rows else after_id), [_event_from_row(r) for r in rows]

    def events(self, run: str | None = None) -> list[Event]:
        sql, args = "SELECT * FROM events ORDER BY id", cast(tuple[Any, ...], ())
        if run is not None:
            sql, args = "SELECT * FROM events WHERE run = ? ORDER BY id", (run,)
        return [_event_from_row(r) for r in self._db.execute(sql, args).fetchall()]
