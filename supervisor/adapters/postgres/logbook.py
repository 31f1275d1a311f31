"""The logbook: append-only events for people. Recording the same key twice stores it once."""

from __future__ import annotations

from supervisor.adapters.postgres.base import PostgresBase
from supervisor.adapters.store_rows import event_evidence, event_from_row
from supervisor.domain.records import Event, EventKind


class PostgresLogbook(PostgresBase):
    def record_event(self, e: Event) -> bool:
        """Append an event unless one with the same key exists. True when it was new."""
        added = self._write(
            "INSERT INTO events(at, run, attempt, job_id, kind, message, evidence, actor, key)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (key) DO NOTHING",
            (e.at, e.run, e.attempt, e.job_id, e.kind.value, e.message, event_evidence(e), e.actor, e.key),
        )
        return added == 1

    def events_of(self, run: str, kinds: tuple[EventKind, ...], limit: int | None = None) -> list[Event]:
        """The run's events of these kinds, oldest first; only the newest ``limit`` when given."""
        rows = self._all(
            "SELECT * FROM events WHERE run = %s AND kind = ANY(%s) ORDER BY id DESC LIMIT %s",
            (run, [k.value for k in kinds], limit),
        )
        return [event_from_row(r) for r in reversed(rows)]

    def last_event(self, run: str, kinds: tuple[EventKind, ...]) -> Event | None:
        row = self._one(
            "SELECT * FROM events WHERE run = %s AND kind = ANY(%s) ORDER BY id DESC LIMIT 1",
            (run, [k.value for k in kinds]),
        )
        return None if row is None else event_from_row(row)

    def last_event_id(self) -> int:
        """The number of the newest event (0 when there is none): a reader starts after it."""
        row = self._one("SELECT COALESCE(MAX(id), 0) AS id FROM events", ())
        return int(row["id"]) if row else 0

    def events_after(self, after_id: int, limit: int = 1000) -> tuple[int, list[Event]]:
        """At most ``limit`` events recorded after the one numbered ``after_id``, in the order they
        were recorded, and the number of the last one (``after_id`` when there is none).

        Ids are drawn when a transaction inserts, not when it commits; every write of the store holds
        the writer lock until it commits (``base``), so ids commit in the order they were drawn and
        a reader never passes over one still open."""
        rows = self._all("SELECT * FROM events WHERE id > %s ORDER BY id LIMIT %s", (after_id, limit))
        return (int(rows[-1]["id"]) if rows else after_id), [event_from_row(r) for r in rows]

    def events(self, run: str | None = None) -> list[Event]:
        if run is None:
            return [event_from_row(r) for r in self._all("SELECT * FROM events ORDER BY id", ())]
        return [event_from_row(r) for r in self._all("SELECT * FROM events WHERE run = %s ORDER BY id", (run,))]
