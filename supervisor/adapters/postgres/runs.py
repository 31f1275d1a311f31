"""Runs, their attempts, the nodes each run keeps out, and each run's telemetry token."""

from __future__ import annotations

import json
import secrets
import time

from psycopg.rows import DictRow

from supervisor.adapters.postgres.alloc_steps import read_step
from supervisor.adapters.postgres.base import PostgresBase
from supervisor.adapters.store_rows import attempt_from_row, names, spec_of, spec_to_json
from supervisor.domain.progress.hang import HangPace
from supervisor.domain.records import AttemptRecord, RunRecord, Successor
from supervisor.domain.run import RestartMode, RunSpec, RunState, transition
from supervisor.ports import PermanentError

# Which column ``attempt_load_failed`` writes: a fixed statement per choice, no name formatted in.
_LOAD_FAILED = {
    False: "UPDATE attempts SET load_failed = %s WHERE run = %s AND seq = %s",
    True: "UPDATE attempts SET failed_before_load = %s WHERE run = %s AND seq = %s",
}


class PostgresRuns(PostgresBase):
    def add_run(self, spec: RunSpec, now: float, owner_uid: int | None = None) -> None:
        """Register a run; ``owner_uid``: who asked (None: the instance's account)."""
        with self.transaction() as db:
            row = db.execute("SELECT state FROM runs WHERE name = %s", (spec.name,)).fetchone()
            if row is not None:
                raise _taken(spec.name, RunState(row["state"]))
            db.execute(
                "INSERT INTO runs(name, spec, state, restarts_spent, created_at, updated_at,"
                " cancel_requested, end_reason, owner_uid) VALUES (%s, %s, %s, 0, %s, %s, false, NULL, %s)",
                (spec.name, json.dumps(spec_to_json(spec)), RunState.REGISTERED.value, now, now, owner_uid),
            )

    def get_run(self, name: str) -> RunRecord | None:
        found = self._runs_from_rows(self._all("SELECT * FROM runs WHERE name = %s", (name,)))
        return found[0] if found else None

    def runs(self, *, active_only: bool = False) -> list[RunRecord]:
        """Four statements whatever the number of runs (the tick reads the active runs several times:
        one round trip per run and table made a tick on PostgreSQL 25 times SQLite's, bench/ha.py)."""
        if active_only:  # the ended runs, however many, are not read at all
            rows = self._all(_ACTIVE_RUNS, ([s.value for s in RunState if s.terminal],))
        else:
            rows = self._all("SELECT * FROM runs ORDER BY created_at, name", ())
        return self._runs_from_rows(rows)

    def set_state(
        self, name: str, state: RunState, now: float, reason: str | None = None, spend_restart: bool = False
    ) -> None:
        with self.transaction() as db:
            row = db.execute("SELECT state FROM runs WHERE name = %s FOR UPDATE", (name,)).fetchone()
            if row is None:
                raise PermanentError(f"unknown run {name!r}")
            transition(name, RunState(row["state"]), state)
            db.execute(
                "UPDATE runs SET state = %s, updated_at = %s, restarts_spent = restarts_spent + %s,"
                " end_reason = CASE WHEN %s THEN %s::text ELSE end_reason END WHERE name = %s",
                (state.value, now, int(spend_restart), state.terminal, reason, name),
            )

    def request_cancel(self, name: str, now: float) -> None:
        changed = self._write("UPDATE runs SET cancel_requested = true, updated_at = %s WHERE name = %s", (now, name))
        if changed == 0:
            raise PermanentError(f"unknown run {name!r}; `slurm-supervisor status` lists the runs")

    def exclude(self, run: str, node: str, reason: str, now: float) -> None:
        self._write(
            "INSERT INTO exclusions(run, node, reason, since, deferred) VALUES (%s, %s, %s, %s, false)"
            " ON CONFLICT (run, node) DO UPDATE SET reason = excluded.reason, since = excluded.since, deferred = false"
            " WHERE exclusions.deferred",
            (run, node, reason, now),
        )

    def unexclude(self, run: str, node: str) -> None:
        self._write("DELETE FROM exclusions WHERE run = %s AND node = %s", (run, node))

    def defer(self, run: str, node: str, reason: str, now: float) -> None:
        """Keep a degraded node out of the run from its next restart or checkpoint boundary on."""
        self._write(
            "INSERT INTO exclusions(run, node, reason, since, deferred) VALUES (%s, %s, %s, %s, true)"
            " ON CONFLICT (run, node) DO NOTHING",
            (run, node, reason, now),
        )

    # ------------------------------------------------------------------ telemetry tokens

    def run_token(self, run: str) -> str:
        """The run's telemetry token, made on first use (random, 256 bits). Never logged."""
        row = self._one("SELECT token FROM run_tokens WHERE run = %s", (run,))
        if row is not None:
            return str(row["token"])
        with self.transaction() as db:
            db.execute(
                "INSERT INTO run_tokens(run, token, created_at) VALUES (%s, %s, %s) ON CONFLICT (run) DO NOTHING",
                (run, secrets.token_urlsafe(32), time.time()),
            )
            made = db.execute("SELECT token FROM run_tokens WHERE run = %s", (run,)).fetchone()
            assert made is not None
            return str(made["token"])

    def active_tokens(self) -> dict[str, str]:
        """Tokens of the runs still supervised: telemetry of ended runs is refused."""
        rows = self._all("SELECT t.run, t.token, r.state FROM run_tokens t JOIN runs r ON r.name = t.run", ())
        return {r["run"]: r["token"] for r in rows if not RunState(r["state"]).terminal}

    # ------------------------------------------------------------------ attempts

    def add_attempt(
        self, run: str, job_id: int, restart_count: int, now: float, excluded: tuple[str, ...] = ()
    ) -> AttemptRecord:
        with self.transaction() as db:
            row = db.execute(
                "SELECT * FROM attempts WHERE run = %s AND job_id = %s AND restart_count = %s",
                (run, job_id, restart_count),
            ).fetchone()
            if row is not None:
                return attempt_from_row(row)
            nxt = db.execute("SELECT COALESCE(MAX(seq) + 1, 0) AS seq FROM attempts WHERE run = %s", (run,)).fetchone()
            seq = int(nxt["seq"]) if nxt else 0
            db.execute(
                "INSERT INTO attempts(run, seq, job_id, restart_count, submitted_at, excluded)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                (run, seq, job_id, restart_count, now, json.dumps(list(excluded))),
            )
            return AttemptRecord(run, seq, job_id, restart_count, now, excluded=excluded)

    def attempt_started(self, run: str, seq: int, nodes: tuple[str, ...], at: float) -> None:
        self._write(
            "UPDATE attempts SET started_at = COALESCE(started_at, %s), nodes = %s WHERE run = %s AND seq = %s",
            (at, json.dumps(list(nodes)), run, seq),
        )

    def attempt_ended(self, run: str, seq: int, at: float, end_state: str, reason: str, exit_code: int | None) -> None:
        self._write(
            "UPDATE attempts SET ended_at = %s, end_state = %s, end_reason = %s, exit_code = %s"
            " WHERE run = %s AND seq = %s AND ended_at IS NULL",
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
        detector learned (read back after a daemon restart)."""
        pace = json.dumps(hang_pace.to_json()) if hang_pace is not None else None
        self._write(
            "UPDATE attempts SET last_step = %s, step_time_s = COALESCE(%s, step_time_s),"
            " hang_pace = COALESCE(%s, hang_pace), save_s = COALESCE(%s, save_s) WHERE run = %s AND seq = %s",
            (last_step, step_time_s, pace, save_s, run, seq),
        )

    def attempt_load_failed(self, run: str, seq: int, why: str, *, before_load: bool = False) -> None:
        """Why the attempt's log shows its checkpoint load failed — or, ``before_load``, what it died
        of before any load began (read back by checkpoint fallback, after a daemon restart too)."""
        self._write(_LOAD_FAILED[before_load], (why, run, seq))

    def attempt_continued(self, run: str, seq: int, checkpoint: str) -> None:
        """The attempt ended on purpose after a verified save and was continued from ``checkpoint``."""
        self._write("UPDATE attempts SET continued_with = %s WHERE run = %s AND seq = %s", (checkpoint, run, seq))

    def attempt_preempted(self, run: str, seq: int, at: float) -> None:
        """Slurm began preempting the attempt at ``at`` (the first time seen is kept)."""
        self._write(
            "UPDATE attempts SET preempted_at = COALESCE(preempted_at, %s) WHERE run = %s AND seq = %s", (at, run, seq)
        )

    def set_successor(self, run: str, successor: Successor) -> None:
        s = successor
        self._write(
            "INSERT INTO successors(run, job_id, after_seq, submitted_at, excluded) VALUES (%s, %s, %s, %s, %s)"
            " ON CONFLICT (run) DO UPDATE SET job_id = excluded.job_id, after_seq = excluded.after_seq,"
            " submitted_at = excluded.submitted_at, excluded = excluded.excluded",
            (run, s.job_id, s.after_seq, s.submitted_at, json.dumps(list(s.exclude))),
        )

    def drop_successor(self, run: str, job_id: int) -> None:
        self._write("DELETE FROM successors WHERE run = %s AND job_id = %s", (run, job_id))

    def attempts(self, run: str, last: int | None = None) -> list[AttemptRecord]:
        """The run's attempts in order; only the newest ``last`` when given."""
        rows = self._all("SELECT * FROM attempts WHERE run = %s ORDER BY seq DESC LIMIT %s", (run, last))
        return [attempt_from_row(r) for r in reversed(rows)]

    # ------------------------------------------------------------------ reading a run whole

    def _runs_from_rows(self, rows: list[DictRow]) -> list[RunRecord]:
        """The runs of ``rows``, each whole: its newest attempt, exclusions and successor, one
        statement per table for all of them."""
        if not rows:
            return []
        names = [r["name"] for r in rows]
        newest = {a["run"]: a for a in self._all(_NEWEST_ATTEMPTS, (names,))}
        kept_out: dict[str, list[DictRow]] = {}
        for r in self._all(_EXCLUSIONS, (names,)):
            kept_out.setdefault(r["run"], []).append(r)
        successors = {r["run"]: r for r in self._all("SELECT * FROM successors WHERE run = ANY(%s)", (names,))}
        return [
            self._record(r, newest.get(r["name"]), kept_out.get(r["name"], []), successors.get(r["name"])) for r in rows
        ]

    def _record(self, row: DictRow, a: DictRow | None, ex: list[DictRow], succ: DictRow | None) -> RunRecord:
        name = row["name"]
        spec = spec_of(row["spec"])
        in_allocation = spec.restart_mode is RestartMode.IN_ALLOCATION and a is not None
        return RunRecord(
            spec=spec,
            state=RunState(row["state"]),
            restarts_spent=row["restarts_spent"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            cancel_requested=bool(row["cancel_requested"]),
            end_reason=row["end_reason"],
            attempt=None if a is None else attempt_from_row(a),
            excluded={r["node"]: r["reason"] for r in ex if not r["deferred"]},
            deferred={r["node"]: (r["since"], r["reason"]) for r in ex if r["deferred"]},
            owner_uid=row["owner_uid"],
            step=read_step(self._db, name, a["job_id"]) if in_allocation and a is not None else None,
            successor=None if succ is None else _successor(succ),
        )


def _successor(r: DictRow) -> Successor:
    return Successor(r["job_id"], r["after_seq"], r["submitted_at"], names(r["excluded"]))


_ACTIVE_RUNS = "SELECT * FROM runs WHERE state <> ALL(%s) ORDER BY created_at, name"
_NEWEST_ATTEMPTS = "SELECT DISTINCT ON (run) * FROM attempts WHERE run = ANY(%s) ORDER BY run, seq DESC"
_EXCLUSIONS = "SELECT run, node, reason, since, deferred FROM exclusions WHERE run = ANY(%s) ORDER BY run, node"


def _taken(name: str, state: RunState) -> PermanentError:
    if not state.terminal:
        return PermanentError(
            f"run {name!r} is already supervised (state {state.value}); "
            f"cancel it first with `slurm-supervisor cancel {name}` or choose another name"
        )
    return PermanentError(  # its attempts and logbook stay attached to the name
        f"run {name!r} already exists ({state.value}) and keeps its logbook; "
        f'register the retry under a new name, e.g. name = "{name}-2" in [run]'
    )
