"""The intent journal: every action is written before it is performed and marked done after."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from supervisor.adapters.postgres.base import PostgresBase
from supervisor.adapters.store_rows import action_from_row
from supervisor.ports import Intent


class PostgresJournal(PostgresBase):
    def begin_action(self, run: str, kind: str, params: Mapping[str, Any], now: float) -> int:
        with self.transaction() as db:
            row = db.execute(
                "INSERT INTO actions(run, kind, params, status, created_at, epoch)"
                " VALUES (%s, %s, %s, 'pending', %s, %s) RETURNING id",
                (run, kind, json.dumps(params, sort_keys=True), now, self._held_epoch),
            ).fetchone()
        assert row is not None
        return int(row["id"])

    def complete_action(self, action_id: int, status: str, result: Mapping[str, Any], now: float) -> None:
        self._write(
            "UPDATE actions SET status = %s, result = %s, completed_at = %s WHERE id = %s",
            (status, json.dumps(result, sort_keys=True), now, action_id),
        )

    def open_actions(self) -> list[Intent]:
        rows = self._all(
            "SELECT id, run, kind, params, created_at FROM actions WHERE status = 'pending' ORDER BY id", ()
        )
        return [
            Intent(int(r["id"]), r["run"], r["kind"], json.loads(r["params"]), float(r["created_at"])) for r in rows
        ]

    def actions(self, run: str | None = None) -> list[dict[str, Any]]:
        """Every intent, completed or not, with its status and result (tests read the whole journal)."""
        if run is None:
            return [action_from_row(r) for r in self._all("SELECT * FROM actions ORDER BY id", ())]
        return [action_from_row(r) for r in self._all("SELECT * FROM actions WHERE run = %s ORDER BY id", (run,))]

    def refused_submissions(self, run: str, since: float) -> list[tuple[float, str]]:
        """(when, Slurm's error) of the run's submissions that failed for good since ``since``."""
        rows = self._all(
            "SELECT completed_at, result FROM actions WHERE run = %s AND kind = 'submit' AND status = 'failed'"
            " AND completed_at >= %s ORDER BY id",
            (run, since),
        )
        return [(float(r["completed_at"]), str(json.loads(r["result"] or "{}").get("error", ""))) for r in rows]

    def action_done(self, run: str, kind: str, params: Mapping[str, Any]) -> bool:
        row = self._one(
            "SELECT 1 AS done FROM actions WHERE run = %s AND kind = %s AND params = %s AND status = 'done' LIMIT 1",
            (run, kind, json.dumps(params, sort_keys=True)),
        )
        return row is not None
