"""Rollbacks decided after loss spikes that did not heal: planned, done, blocked."""

from __future__ import annotations

import json

from supervisor.adapters.sqlite.base import SqliteBase
from supervisor.domain.spikes.rollback import RollbackRecord


class SqliteRollbacks(SqliteBase):
    def record_rollback(self, rollback: RollbackRecord) -> None:
        """Remember a rollback decision (once per run, attempt and spike onset)."""
        r = rollback
        self._db.execute(
            "INSERT OR IGNORE INTO rollbacks(run, attempt, onset_step, status, at, record) VALUES (?, ?, ?, ?, ?, ?)",
            (r.run, r.attempt, r.onset_step, r.status.value, r.at, json.dumps(r.to_json())),
        )

    def rollbacks_done(self, run: str, before_attempt: int) -> None:
        """The planned rollbacks of attempts before ``before_attempt`` were carried out."""
        self._db.execute(
            "UPDATE rollbacks SET status = 'done', record = json_set(record, '$.status', 'done')"
            " WHERE run = ? AND status = 'planned' AND attempt < ?",
            (run, before_attempt),
        )

    def rollbacks(self, run: str) -> list[RollbackRecord]:
        """Every rollback decision of the run, oldest first."""
        rows = self._db.execute("SELECT record FROM rollbacks WHERE run = ? ORDER BY at, attempt", (run,)).fetchall()
        return [RollbackRecord.from_json(json.loads(r["record"])) for r in rows]


__all__ = ["SqliteRollbacks"]
