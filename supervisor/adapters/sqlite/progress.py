"""The progress series: the points the daemon read from each attempt's training log, bounded per run.

Writes append; once a run holds twice its bound, its series is thinned back to the bound
(domain.progress.series.decimate: each attempt's first and last point and the loss extremes stay),
so a 54-day run costs a few thousand rows, and thinning runs once per bound's worth of points.
"""

from __future__ import annotations

from collections.abc import Sequence

from supervisor.adapters.sqlite.base import SqliteBase
from supervisor.domain.progress.series import MAX_POINTS, ProgressPoint, decimate

_INSERT = (
    "INSERT OR REPLACE INTO progress(run, attempt, step, at, loss, step_time_s, tokens_per_s, samples_per_s)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_SELECT = (
    "SELECT run, attempt, step, at, loss, step_time_s, tokens_per_s, samples_per_s FROM progress"
    " WHERE run = ? ORDER BY attempt, step"
)


class SqliteProgress(SqliteBase):
    progress_limit: int = MAX_POINTS

    def record_progress(self, points: Sequence[ProgressPoint]) -> None:
        """Add points (a step an attempt logged again replaces its point); thin runs past the bound."""
        if not points:
            return
        rows = [
            (p.run, p.attempt, p.step, p.at, p.loss, p.step_time_s, p.tokens_per_s, p.samples_per_s) for p in points
        ]
        with self.transaction():
            self._db.executemany(_INSERT, rows)
            for run in sorted({p.run for p in points}):
                self._thin(run)

    def progress(self, run: str) -> list[ProgressPoint]:
        """The run's series, attempt by attempt, step by step."""
        rows = self._db.execute(_SELECT, (run,)).fetchall()
        return [ProgressPoint(*tuple(r)) for r in rows]

    def _thin(self, run: str) -> None:
        count = self._db.execute("SELECT count(*) FROM progress WHERE run = ?", (run,)).fetchone()[0]
        if count <= 2 * self.progress_limit:
            return
        kept = decimate(self.progress(run), self.progress_limit)
        self._db.execute("DELETE FROM progress WHERE run = ?", (run,))
        self._db.executemany(
            _INSERT,
            [_row(p) for p in kept],
        )


def _row(p: ProgressPoint) -> tuple[object, ...]:
    return (p.run, p.attempt, p.step, p.at, p.loss, p.step_time_s, p.tokens_per_s, p.samples_per_s)


__all__ = ["SqliteProgress"]
