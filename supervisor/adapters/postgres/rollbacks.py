"""Rollbacks decided after loss spikes that did not heal: planned, done, blocked."""

from __future__ import annotations

import json

from supervisor.adapters.postgres.base import PostgresBase
from supervisor.domain.spikes.rollback import RollbackRecord


class PostgresRollbacks(PostgresBase):
    def record_rollback(self, rollback: RollbackRecord) -> None:
        """Remember a rollback decision (once per run, attempt and spike onset)."""
        r = rollback
        self._write(
            "INSERT INTO rollbacks(run, attempt, onset_step, status, at, record) VALUES (%s, %s, %s, %s, %s, %s)"
            " ON CONFLICT DO NOTHING",
            (r.run, r.attempt, r.onset_step, r.status.value, r.at, json.dumps(r.to_json())),
        )

    def rollbacks_done(self, run: str, before_attempt: int) -> None:
        """The planned rollbacks of attempts before ``before_attempt`` were carried out."""
        self._write(
            "UPDATE rollbacks SET status = 'done', record = jsonb_set(record::jsonb, '{status}', '\"done\"')::text"
            " WHERE run = %s AND status = 'planned' AND attempt < %s",
            (run, before_attempt),
        )

    def rollbacks(self, run: str) -> list[RollbackRecord]:
        """Every rollback decision of the run, oldest first."""
        rows = self._all("SELECT record FROM rollbacks WHERE run = %s ORDER BY at, attempt", (run,))
        return [RollbackRecord.from_json(json.loads(r["record"])) for r in rows]
