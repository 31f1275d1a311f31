"""The checkpoint ledger: checkpoints seen in each run's storage, what their verifications
found, and those passed over (demoted) with why."""

from __future__ import annotations

import json

from supervisor.adapters.sqlite.base import SqliteBase
from supervisor.adapters.sqlite.decoded import resume_plan
from supervisor.adapters.store_rows import result_from_json as _result_from_json
from supervisor.adapters.store_rows import result_to_json as _result_to_json
from supervisor.domain.checkpoints.manifest import CheckpointRef, Guarantee, Level, VerifyResult
from supervisor.domain.checkpoints.resume import ResumePlan


class SqliteCheckpoints(SqliteBase):
    def checkpoint_seen(self, run: str, ref: CheckpointRef, now: float) -> bool:
        """Remember a checkpoint found in storage. True when it is new or changed (e.g. its
        commit marker appeared): it needs verifying (again)."""
        with self.transaction() as db:
            row = db.execute(
                "SELECT committed, seen_at FROM checkpoints WHERE run = ? AND location = ?", (run, ref.location)
            ).fetchone()
            if row is None:
                db.execute(
                    "INSERT INTO checkpoints(run, location, name, step, guarantee, committed, seen_at,"
                    " first_seen) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (run, ref.location, ref.name, ref.step, ref.guarantee.value, int(ref.committed), ref.seen_at, now),
                )
                return True
            if bool(row["committed"]) == ref.committed and row["seen_at"] >= ref.seen_at:
                return False
            db.execute(
                "UPDATE checkpoints SET committed = ?, seen_at = ?, step = ?, guarantee = ?,"
                " metadata_result = NULL, full_result = NULL WHERE run = ? AND location = ?",
                (int(ref.committed), ref.seen_at, ref.step, ref.guarantee.value, run, ref.location),
            )
            return True

    def checkpoint_state(self, run: str, location: str) -> tuple[bool, float] | None:
        """(committed, seen_at) as stored for the checkpoint; None when it was never seen."""
        row = self._db.execute(
            "SELECT committed, seen_at FROM checkpoints WHERE run = ? AND location = ?", (run, location)
        ).fetchone()
        return None if row is None else (bool(row["committed"]), float(row["seen_at"]))

    def checkpoint_result(self, run: str, result: VerifyResult) -> None:
        column = "full_result" if result.level is Level.FULL else "metadata_result"
        with self.transaction() as db:
            db.execute(
                f"UPDATE checkpoints SET {column} = ? WHERE run = ? AND location = ?",  # noqa: S608 - a fixed column name
                (json.dumps(_result_to_json(result)), run, result.location),
            )

    def demote_checkpoint(self, run: str, location: str, why: str) -> None:
        with self.transaction() as db:
            db.execute("UPDATE checkpoints SET demoted = ? WHERE run = ? AND location = ?", (why, run, location))

    def record_resume_plan(self, run: str, attempt: int, plan: ResumePlan) -> None:
        """The plan handed to the run's attempt ``attempt`` (once)."""
        self._db.execute(
            "INSERT OR IGNORE INTO resume_plans(run, attempt, plan) VALUES (?, ?, ?)",
            (run, attempt, json.dumps(plan.to_json())),
        )

    def resume_plans(self, run: str, last: int) -> dict[int, ResumePlan]:
        """Attempt -> the plan it was handed, for the run's newest ``last`` attempts that had one."""
        rows = self._db.execute(
            "SELECT attempt, plan FROM resume_plans WHERE run = ? ORDER BY attempt DESC LIMIT ?", (run, last)
        ).fetchall()
        return {r["attempt"]: resume_plan(r["plan"]) for r in rows}

    def checkpoints(
        self, run: str, limit: int | None = None
    ) -> list[tuple[CheckpointRef, VerifyResult | None, VerifyResult | None, str | None]]:
        """(ref, metadata result, full result, demoted reason) per checkpoint, newest step first;
        only the newest ``limit`` when given."""
        rows = self._db.execute(
            "SELECT * FROM checkpoints WHERE run = ? ORDER BY step DESC, first_seen DESC LIMIT ?",
            (run, -1 if limit is None else limit),
        ).fetchall()
        out = []
        for r in rows:
            ref = CheckpointRef(
                r["location"], r["name"], r["step"], Guarantee(r["guarantee"]), bool(r["committed"]), r["seen_at"]
            )
            out.append(
                (ref, _result_from_json(r["metadata_result"]), _result_from_json(r["full_result"]), r["demoted"])
            )
        return out
