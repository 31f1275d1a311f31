"""The progress series: the points the daemon read from each attempt's training log, bounded per run.

Writes append; once a run holds twice its bound, its series is thinned back to the bound
(domain.progress.series.decimate), as the SQLite store does (``adapters.sqlite.progress``).
"""

from __future__ import annotations

from collections.abc import Sequence

from supervisor.adapters.postgres.base import PostgresBase
from supervisor.domain.progress.series import MAX_POINTS, ProgressPoint, decimate

_INSERT = (
    "INSERT INTO progress(run, attempt, step, at, loss, step_time_s, tokens_per_s, samples_per_s)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (run, attempt, step) DO UPDATE SET at = excluded.at,"
    " loss = excluded.loss, step_time_s = excluded.step_time_s, tokens_per_s = excluded.tokens_per_s,"
    " samples_per_s = excluded.samples_per_s"
)
_SELECT = (
    "SELECT run, attempt, step, at, loss, step_time_s, tokens_per_s, samples_per_s FROM progress"
    " WHERE run = %s ORDER BY attempt, step"
)


class PostgresProgress(PostgresBase):
    progress_limit: int = MAX_POINTS

    def record_progress(self, points: Sequence[ProgressPoint]) -> None:
        """Add points (a step an attempt logged again replaces its point); thin runs past the bound."""
        if not points:
            return
        newest = {(p.run, p.attempt, p.step): p for p in points}  # one row per key in one statement
        with self.transaction():
            self._write_many(_INSERT, [_row(p) for p in newest.values()])
            for run in sorted({p.run for p in points}):
                self._thin(run)

    def progress(self, run: str) -> list[ProgressPoint]:
        """The run's series, attempt by attempt, step by step."""
        return [ProgressPoint(*r.values()) for r in self._all(_SELECT, (run,))]

    def _thin(self, run: str) -> None:
        row = self._one("SELECT count(*) AS n FROM progress WHERE run = %s", (run,))
        if row is None or row["n"] <= 2 * self.progress_limit:
            return
        kept = decimate(self.progress(run), self.progress_limit)
        self._write("DELETE FROM progress WHERE run = %s", (run,))
        self._write_many(_INSERT, [_row(p) for p in kept])


def _row(p: ProgressPoint) -> tuple[object, ...]:
    return (p.run, p.attempt, p.step, p.at, p.loss, p.step_time_s, p.tokens_per_s, p.samples_per_s)
