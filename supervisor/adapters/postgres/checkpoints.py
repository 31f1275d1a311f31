"""The checkpoint ledger: checkpoints seen in each run's storage, what their verifications
found, and those passed over (demoted) with why."""

from __future__ import annotations

import json

from supervisor.adapters.postgres.base import PostgresBase
from supervisor.adapters.store_rows import result_from_json, result_to_json, resume_plan
from supervisor.domain.checkpoints.manifest import CheckpointRef, Guarantee, Level, VerifyResult
from supervisor.domain.checkpoints.resume import ResumePlan

# Which column ``checkpoint_result`` writes: a fixed statement per level, no name formatted in.
_RESULT = {
    Level.FULL: "UPDATE checkpoints SET full_result = %s WHERE run = %s AND location = %s",
    Level.METADATA: "UPDATE checkpoints SET metadata_result = %s WHERE run = %s AND location = %s",
}

Listed = tuple[CheckpointRef, VerifyResult | None, VerifyResult | None, str | None]


class PostgresCheckpoints(PostgresBase):
    def checkpoint_seen(self, run: str, ref: CheckpointRef, now: float) -> bool:
        """Remember a checkpoint found in storage. True when it is new or changed (e.g. its
        commit marker appeared): it needs verifying (again)."""
        with self.transaction() as db:
            row = db.execute(
                "SELECT committed, seen_at FROM checkpoints WHERE run = %s AND location = %s", (run, ref.location)
            ).fetchone()
            if row is None:
                db.execute(
                    "INSERT INTO checkpoints(run, location, name, step, guarantee, committed, seen_at,"
                    " first_seen) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                    (run, ref.location, ref.name, ref.step, ref.guarantee.value, ref.committed, ref.seen_at, now),
                )
                return True
            if bool(row["committed"]) == ref.committed and row["seen_at"] >= ref.seen_at:
                return False
            db.execute(
                "UPDATE checkpoints SET committed = %s, seen_at = %s, step = %s, guarantee = %s,"
                " metadata_result = NULL, full_result = NULL WHERE run = %s AND location = %s",
                (ref.committed, ref.seen_at, ref.step, ref.guarantee.value, run, ref.location),
            )
            return True

    def checkpoint_state(self, run: str, location: str) -> tuple[bool, float] | None:
        """(committed, seen_at) as stored for the checkpoint; None when it was never seen."""
        row = self._one("SELECT committed, seen_at FROM checkpoints WHERE run = %s AND location = %s", (run, location))
        return None if row is None else (bool(row["committed"]), float(row["seen_at"]))

    def checkpoint_result(self, run: str, result: VerifyResult) -> None:
        statement = _RESULT[Level.FULL if result.level is Level.FULL else Level.METADATA]
        self._write(statement, (json.dumps(result_to_json(result)), run, result.location))

    def demote_checkpoint(self, run: str, location: str, why: str) -> None:
        self._write("UPDATE checkpoints SET demoted = %s WHERE run = %s AND location = %s", (why, run, location))

    def record_resume_plan(self, run: str, attempt: int, plan: ResumePlan) -> None:
        """The plan handed to the run's attempt ``attempt`` (once)."""
        self._write(
            "INSERT INTO resume_plans(run, attempt, plan) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
            (run, attempt, json.dumps(plan.to_json())),
        )

    def resume_plans(self, run: str, last: int) -> dict[int, ResumePlan]:
        """Attempt -> the plan it was handed, for the run's newest ``last`` attempts that had one."""
        rows = self._all(
            "SELECT attempt, plan FROM resume_plans WHERE run = %s ORDER BY attempt DESC LIMIT %s", (run, last)
        )
        return {r["attempt"]: resume_plan(r["plan"]) for r in rows}

    def checkpoints(self, run: str, limit: int | None = None) -> list[Listed]:
        """(ref, metadata result, full result, demoted reason) per checkpoint, newest step first
        (a checkpoint of no known step last, as SQLite sorts it); only the newest ``limit`` when given."""
        rows = self._all(
            "SELECT * FROM checkpoints WHERE run = %s ORDER BY step DESC NULLS LAST, first_seen DESC LIMIT %s",
            (run, limit),
        )
        out: list[Listed] = []
        for r in rows:
            ref = CheckpointRef(
                r["location"], r["name"], r["step"], Guarantee(r["guarantee"]), bool(r["committed"]), r["seen_at"]
            )
            out.append((ref, result_from_json(r["metadata_result"]), result_from_json(r["full_result"]), r["demoted"]))
        return out
