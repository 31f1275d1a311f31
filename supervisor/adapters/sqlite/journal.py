"""The intent journal: every action is written before it is performed and marked done after."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

from supervisor.adapters.sqlite.base import SqliteBase
from supervisor.adapters.store_rows import action_from_row as _action_row
from supervisor.ports import Intent


class SqliteJournal(SqliteBase):
    def begin_action(self, run: str, kind: str, params: Mapping[str, Any], now: float) -> int:
        cur = self._db.execute(
            "INSERT INTO actions(run, kind, params, status, created_at, epoch) VALUES (?, ?, ?, 'pending', ?, ?)",
            (run, kind, json.dumps(params, sort_keys=True), now, self._held_epoch),
        )
        return int(cur.lastrowid or 0)

    def complete_action(self, action_id: int, status: str, result: Mapping[str, Any], now: float) -> None:
        self._db.execute(
            "UPDATE actions SET status = ?, result = ?, completed_at = ? WHERE id = ?",
            (status, json.dumps(result, sort_keys=True), now, action_id),
        )

    def open_actions(self) -> list[Intent]:
        rows = self._db.execute(
            "SELECT id, run, kind, params, created_at FROM actions WHERE status = 'pending' ORDER BY id"
        ).fetchall()
        return [
            Intent(int(r["id"]), r["run"], r["kind"], json.loads(r["params"]), float(r["created_at"])) for r in rows
        ]

    def actions(self, run: str | None = None) -> list[dict[str, Any]]:
        """Every intent, completed or not, with its status and result (tests read the whole journal)."""
        sql, args = "SELECT * FROM actions ORDER BY id", cast(tuple[Any, ...], ())
        if run is not None:
            sql, args = "SELECT * FROM actions WHERE run = ? ORDER BY id", (run,)
        return [_action_row(r) for r in self._db.execute(sql, args).fetchall()]

    def refused_submissions(self, run: str, since: float) -> list[tuple[float, str]]:
        """(when, Slurm's error) of the run's submissions that failed for good since ``since``."""
        rows = self._db.execute(
            "SELECT completed_at, result FROM actions WHERE run = ? AND kind = 'submit' AND status = 'failed'"
            " AND completed_at >= ? ORDER BY id",
            (run, since),
        ).fetchall()
        return [(float(r["completed_at"]), str(json.loads(r["result"] or "{}").get("error", ""))) for r in rows]

    def action_done(self, run: str, kind: str, params: Mapping[str, Any]) -> bool:
        row = self._db.execute(
            "SELECT 1 FROM actions WHERE run = ? AND kind = ? AND params = ? AND status = 'done' LIMIT 1",
            (run, kind, json.dumps(params, sort_keys=True)),
        ).fetchone()
        return row is not None
