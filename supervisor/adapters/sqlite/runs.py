"""Runs, their attempts, the nodes each run keeps out, and each run's telemetry token."""

from __future__ import annotations

import json
import secrets
import sqlite3
import time

from supervisor.adapters.sqlite.alloc_steps import read_step
from supervisor.adapters.sqlite.base import SqliteBase
from supervisor.adapters.sqlite.decoded import names
from supervisor.adapters.store_rows import attempt_from_row as _attempt_from_row
from supervisor.adapters.store_rows import spec_of as _spec_of
from supervisor.adapters.store_rows import spec_to_json as _spec_to_json
from supervisor.domain.progress.hang import HangPace
from supervisor.domain.records import AttemptRecord, RunRecord, Successor
from supervisor.domain.run import (
    RestartMode,
    RunSpec,
    RunState,
    transition,
)
from supervisor.ports import PermanentError


class SqliteRuns(SqliteBase):
    def add_run(self, spec: RunSpec, now: float, owner_uid: int | None = None) -> None:
        """Register a run; ``owner_uid``: who asked (None: the instance's account)."""
        with self.transaction() as db:
            row = db.execute("SELECT state FROM runs WHERE name = ?", (spec.name,)).fetchone()
            if row is not None and not RunState(row["state"]).terminal:
                raise PermanentError(
                    f"run {spec.name!r} is already supervised (state {row['state']}); "
                    f"cancel it first with `slurm-supervisor cancel {spec.name}` or choose another name"
                )
            if row is not None:  # its attempts and logbook stay attached to the name
                raise PermanentError(
                    f"run {spec.name!r} already exists ({row['state']}) and keeps its logbook; "
                    f'register the retry under a new name, e.g. name = "{spec.name}-2" in [run]'
                )
            db.execute(
                "INSERT INTO runs(name, spec, state, restarts_spent, created_at, updated_at,"
                " cancel_requested, end_reason, owner_uid) VALUES (?, ?, ?, 0, ?, ?, 0, NULL, ?)",
                (spec.name, json.dumps(_spec_to_json(spec)), RunState.REGISTERED.value, now, now, owner_uid),
            )

    def get_run(self, name: str) -> RunRecord | None:
        row = self._db.execute("SELECT * FROM runs WHERE name = ?", (name,)).fetchone()
        return None if row is None else self._run_from_row(row)

    def runs(self, *, active_only: bool = False) -> list[RunRecord]:
        rows = self._db.execute("SELECT * FROM runs ORDER BY created_at, name").fetchall()
        runs = [self._run_from_row(r) for r in rows]
        return [r for r in runs if not r.state.terminal] if active_only else runs

    def set_state(
        self, name: str, state: RunState, now: float, reason: str | None = None, spend_restart: bool = False
    ) -> None:
        with self.transaction() as db:
            row = db.execute("SELECT state FROM runs WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise PermanentError(f"unknown run {name!r}")
            transition(name, RunState(row["state"]), state)
            db.execute(
                "UPDATE runs SET state = ?, updated_at = ?, restarts_spent = restarts_spent + ?,"
                " end_reason = CASE WHEN ? THEN ? ELSE end_reason END WHERE name = ?",
                (state.value, now, int(spend_restart), int(state.terminal), reason, name),
            )

    def request_cancel(self, name: str, now: float) -> None:
        with self.transaction() as db:
            cur = db.execute("UPDATE runs SET cancel_requested = 1, updated_at = ? WHERE name = ?", (now, name))
            if cur.rowcount == 0:
                raise PermanentError(f"unknown run {name!r}; `slurm-supervisor status` lists the runs")

    def exclude(self, run: str, node: str, reason: str, now: float) -> None:
        self._db.execute(
            "INSERT INTO exclusions(run, node, reason, since, deferred) VALUES (?, ?, ?, ?, 0)"
            " ON CONFLICT(run, node) DO UPDATE SET reason = excluded.reason, since = excluded.since, deferred = 0"
            " WHERE exclusions.deferred = 1",
            (run, node, reason, now),
        )

    def unexclude(self, run: str, node: str) -> None:
        self._db.execute("DELETE FROM exclusions WHERE run = ? AND node = ?", (run, node))

    def defer(self, run: str, node: str, reason: str, now: float) -> None:
        """Keep a degraded node out of the run from its next restart or checkpoint boundary on."""
        self._db.execute(
            "INSERT OR IGNORE INTO exclusions(run, node, reason, since, deferred) VALUES (?, ?, ?, ?, 1)",
            (run, node, reason, now),
        )

    # ------------------------------------------------------------------ telemetry tokens

    def run_token(self, run: str) -> str:
        """The run's telemetry token, made on first use (random, 256 bits). Never logged."""
        row = self._db.execute("SELECT token FROM run_tokens WHERE run = ?", (run,)).fetchone()
        if row is not None:
            return str(row["token"])
        with self.transaction() as db:
            db.execute(
                "INSERT OR IGNORE INTO run_tokens(run, token, created_at) VALUES (?, ?, ?)",
                (run, secrets.token_urlsafe(32), time.time()),
            )
            return str(db.execute("SELECT token FROM run_tokens WHERE run = ?", (run,)).fetchone()["token"])

    def active_tokens(self) -> dict[str, str]:
        """Tokens of the runs still supervised: telemetry of ended runs is refused."""
        rows = self._db.execute(
            "SELECT t.run, t.token, r.state FROM run_tokens t JOIN runs r ON r.name = t.run"
        ).fetchall()
        return {r["run"]: r["token"] for r in rows if not RunState(r["state"]).terminal}

    def add_attempt(
        self, run: str, job_id: int, restart_count: int, now: float, excluded: tuple[str, ...] = ()
    ) -> AttemptRecord:
        with self.transaction() as db:
            row = db.execute(
                "SELECT * FROM attempts WHERE run = ? AND job_id = ? AND restart_count = ?",
                (run, job_id, restart_count),
            ).fetchone()
            if row is not None:
                return _attempt_from_row(row)
            seq = db.execute("SELECT COALESCE(MAX(seq) + 1, 0) FROM attempts WHERE run = ?", (run,)).fetchone()[0]
            db.execute(
                "INSERT INTO attempts(run, seq, job_id, restart_count, submitted_at, excluded) VALUES (?, ?, ?, ?, ?, ?)",
                (run, seq, job_id, restart_count, now, json.dumps(list(excluded))),
            )
            return AttemptRecord(run, seq, job_id, restart_count, now, excluded=excluded)

    def attempt_started(self, run: str, seq: int, nodes: tuple[str, ...], at: float) -> None:
        self._db.execute(
            "UPDATE attempts SET started_at = COALESCE(started_at, ?), nodes = ? WHERE run = ? AND seq = ?",
            (at, json.dumps(list(nodes)), run, seq),
        )

    def attempt_ended(self, run: str, seq: int, at: float, end_state: str, reason: str, exit_code: int | None) -> None:
        self._db.execute(
            "UPDATE attempts SET ended_at = ?, end_state = ?, end_reason = ?, exit_code = ?"
            " WHERE run = ? AND seq = ? AND ended_at IS NULL",
            (at, end_state, reason, exit_code, run, seq),
        )

    def attempt_progress(
        self,
        run: str,
        seq: int,
        last_step: int,
        step_time_s: float | None,
        hang_pace: HangPace | None = None,
        save_s: float | None = None,
    ) -> None:
        """What the attempt's log showed last: its newest step and step time, and the pace the hang
        detector learned (read back after a daemon restart, e.g. to tell whether a resumed
        checkpoint loaded, or to judge a hang on the known pace)."""
        pace = json.dumps(hang_pace.to_json()) if hang_pace is not None else None
        self._db.execute(
            "UPDATE attempts SET last_step = ?, step_time_s = COALESCE(?, step_time_s),"
            " hang_pace = COALESCE(?, hang_pace), save_s = COALESCE(?, save_s) WHERE run = ? AND seq = ?",
            (last_step, step_time_s, pace, save_s, run, seq),
        )

    def attempt_load_failed(self, run: str, seq: int, why: str, *, before_load: bool = False) -> None:
        """Why the attempt's log shows its checkpoint load failed — or, ``before_load``, what it died
        of before any load began (read back by checkpoint fallback, after a daemon restart too)."""
        column = "failed_before_load" if before_load else "load_failed"
        self._db.execute(f"UPDATE attempts SET {column} = ? WHERE run = ? AND seq = ?", (why, run, seq))  # noqa: S608

    def attempt_continued(self, run: str, seq: int, checkpoint: str) -> None:
        """The attempt ended on purpose after a verified save and was continued from ``checkpoint``."""
        self._db.execute("UPDATE attempts SET continued_with = ? WHERE run = ? AND seq = ?", (checkpoint, run, seq))

    def attempt_preempted(self, run: str, seq: int, at: float) -> None:
        """Slurm began preempting the attempt at ``at`` (the first time seen is kept)."""
        self._db.execute(
            "UPDATE attempts SET preempted_at = COALESCE(preempted_at, ?) WHERE run = ? AND seq = ?", (at, run, seq)
        )

    def set_successor(self, run: str, successor: Successor) -> None:
        s = successor
        self._db.execute(
            "INSERT OR REPLACE INTO successors(run, job_id, after_seq, submitted_at, excluded) VALUES (?, ?, ?, ?, ?)",
            (run, s.job_id, s.after_seq, s.submitted_at, json.dumps(list(s.exclude))),
        )

    def drop_successor(self, run: str, job_id: int) -> None:
        self._db.execute("DELETE FROM successors WHERE run = ? AND job_id = ?", (run, job_id))

    def attempts(self, run: str, last: int | None = None) -> list[AttemptRecord]:
        """The run's attempts in order; only the newest ``last`` when given."""
        rows = self._db.execute(
            "SELECT * FROM attempts WHERE run = ? ORDER BY seq DESC LIMIT ?", (run, -1 if last is None else last)
        ).fetchall()
        return [_attempt_from_row(r) for r in reversed(rows)]

    def _run_from_row(self, row: sqlite3.Row) -> RunRecord:
        name = row["name"]
        a = self._db.execute("SELECT * FROM attempts WHERE run = ? ORDER BY seq DESC LIMIT 1", (name,)).fetchone()
        ex = self._db.execute(
            "SELECT node, reason, since, deferred FROM exclusions WHERE run = ? ORDER BY node", (name,)
        ).fetchall()
        spec = _spec_of(row["spec"])
        in_allocation = spec.restart_mode is RestartMode.IN_ALLOCATION and a is not None
        return RunRecord(
            spec=spec,
            state=RunState(row["state"]),
            restarts_spent=row["restarts_spent"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            cancel_requested=bool(row["cancel_requested"]),
            end_reason=row["end_reason"],
            attempt=None if a is None else _attempt_from_row(a),
            excluded={r["node"]: r["reason"] for r in ex if not r["deferred"]},
            deferred={r["node"]: (r["since"], r["reason"]) for r in ex if r["deferred"]},
            owner_uid=row["owner_uid"],
            step=read_step(self._db, name, a["job_id"]) if in_allocation else None,
            successor=self._successor(name),
        )

    def _successor(self, run: str) -> Successor | None:
        r = self._db.execute("SELECT * FROM successors WHERE run = ?", (run,)).fetchone()
        return None if r is None else Successor(r["job_id"], r["after_seq"], r["submitted_at"], names(r["excluded"]))
