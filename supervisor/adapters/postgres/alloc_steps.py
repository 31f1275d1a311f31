"""In-allocation recovery's step records: the goal each job's step converges on (written by the
engine's journaled ``swap_step`` only) and the launcher's last report (written by the launcher
channel through its own connection: a fact, like a heartbeat, repeated every poll)."""

from __future__ import annotations

import json

from psycopg.rows import DictRow

from supervisor.adapters.postgres.base import Connection, PostgresBase
from supervisor.adapters.store_rows import names, resume_plan
from supervisor.domain.alloc_step import AllocationStep, LauncherReport, StepGoal

_SINCE = "launcher_channel_since"

_REPORT = (
    "INSERT INTO launcher_reports(run, job_id, generation, alive, nodes, host, exit_code, at, ended_at)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (run, job_id) DO UPDATE SET"
    # a death repeated (same generation, dead before) keeps when it was first heard
    " ended_at = CASE WHEN NOT excluded.alive AND NOT launcher_reports.alive"
    " AND launcher_reports.generation = excluded.generation"
    " THEN COALESCE(launcher_reports.ended_at, excluded.ended_at) ELSE excluded.ended_at END,"
    " generation = excluded.generation, alive = excluded.alive, nodes = excluded.nodes,"
    " host = excluded.host, exit_code = excluded.exit_code, at = excluded.at"
)


class PostgresAllocSteps(PostgresBase):
    def set_step_goal(self, run: str, goal: StepGoal) -> bool:
        """Record the goal; the generation is the key, so writing it again changes nothing.
        True when it was new."""
        resume = json.dumps(goal.resume.to_json()) if goal.resume is not None else None
        added = self._write(
            "INSERT INTO alloc_steps(run, job_id, generation, nodes, resume, reason, decided_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (run, goal.job_id, goal.generation, json.dumps(list(goal.nodes)), resume, goal.reason, goal.decided_at),
        )
        return added == 1

    def step_goal(self, run: str, job_id: int) -> StepGoal | None:
        """The job's newest goal (None: generation 0, the launcher's own start)."""
        return _newest_goal(self._db, run, job_id)

    def launcher_reported(self, run: str, report: LauncherReport) -> None:
        r = report
        ended = None if r.alive else r.at
        self._write(
            _REPORT, (run, r.job_id, r.generation, r.alive, json.dumps(list(r.nodes)), r.host, r.exit_code, r.at, ended)
        )

    def launcher_report(self, run: str, job_id: int) -> LauncherReport | None:
        return _report(self._db, run, job_id)

    def channel_listening(self, now: float) -> None:
        """The launcher channel listens from ``now`` (the daemon started)."""
        self._write(
            "INSERT INTO meta(key, value) VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (_SINCE, repr(now)),
        )


def read_step(db: Connection, run: str, job_id: int) -> AllocationStep:
    """The job's step as a run record carries it (read with the run)."""
    since = db.execute("SELECT value FROM meta WHERE key = %s", (_SINCE,)).fetchone()
    at = float(since["value"]) if since else 0.0
    return AllocationStep(_newest_goal(db, run, job_id), _report(db, run, job_id), at)


def _newest_goal(db: Connection, run: str, job_id: int) -> StepGoal | None:
    row = db.execute(
        "SELECT * FROM alloc_steps WHERE run = %s AND job_id = %s ORDER BY generation DESC LIMIT 1", (run, job_id)
    ).fetchone()
    return None if row is None else _goal(row)


def _report(db: Connection, run: str, job_id: int) -> LauncherReport | None:
    row = db.execute("SELECT * FROM launcher_reports WHERE run = %s AND job_id = %s", (run, job_id)).fetchone()
    if row is None:
        return None
    return LauncherReport(
        row["job_id"],
        row["generation"],
        bool(row["alive"]),
        names(row["nodes"]),
        row["host"],
        row["at"],
        row["exit_code"],
        row["ended_at"],
    )


def _goal(row: DictRow) -> StepGoal:
    resume = resume_plan(row["resume"]) if row["resume"] else None
    return StepGoal(row["job_id"], row["generation"], names(row["nodes"]), row["reason"], row["decided_at"], resume)
