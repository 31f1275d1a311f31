"""The supervisor's memory in SQLite (WAL): runs, attempts, nodes, the intent journal, the logbook.

One connection per daemon; every write is one short transaction, so a crash between any two
statements leaves a consistent database. Logbook events carry a unique key: recording the same
event twice (after a crash and a re-decision) stores it once.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

from supervisor.adapters.sqlite_schema import migrate
from supervisor.domain.checkpoints import CheckpointRef, Guarantee, Level, Outcome, ShardProblem, VerifyResult
from supervisor.domain.lemon import Fault
from supervisor.domain.records import AttemptRecord, Event, EventKind, NodeVerdict, RunRecord, Verdict
from supervisor.domain.run import CheckpointPolicy, RestartMode, RunSpec, RunState, SparePolicy, SpikePolicy, transition
from supervisor.ports import PermanentError

DB_NAME = "supervisor.db"


class SqliteStore:
    def __init__(self, state_dir: str | Path) -> None:
        self.path = Path(state_dir) / DB_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, timeout=10.0, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        _enable_wal(self._db)
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        migrate(self._db)
        self.instance_id: str = self._db.execute("SELECT value FROM meta WHERE key = 'instance'").fetchone()[0]

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        if self._db.in_transaction:
            yield self._db
            return
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # ------------------------------------------------------------------ runs

    def add_run(self, spec: RunSpec, now: float) -> None:
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
                " cancel_requested, end_reason) VALUES (?, ?, ?, 0, ?, ?, 0, NULL)",
                (spec.name, json.dumps(_spec_to_json(spec)), RunState.REGISTERED.value, now, now),
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

    # ------------------------------------------------------------------ bad-node memory

    def node_faults(self, since: float) -> list[Fault]:
        """Faults pinned on a node, in every run, since ``since`` (from the logbook)."""
        rows = self._db.execute(
            "SELECT at, run, json_extract(evidence, '$.node') AS node, json_extract(evidence, '$.observed') AS why"
            " FROM events WHERE kind = 'fault' AND at >= ? AND json_extract(evidence, '$.node') IS NOT NULL"
            " ORDER BY id",
            (since,),
        ).fetchall()
        return [Fault(r["node"], r["at"], r["run"], r["why"] or "fault") for r in rows]

    def clear_quarantine(self, node: str, now: float, by: str, note: str) -> None:
        with self.transaction() as db:
            db.execute("INSERT INTO quarantine_clears(node, at, by, note) VALUES (?, ?, ?, ?)", (node, now, by, note))

    def quarantine_clears(self) -> dict[str, float]:
        rows = self._db.execute("SELECT node, MAX(at) AS at FROM quarantine_clears GROUP BY node").fetchall()
        return {r["node"]: r["at"] for r in rows}

    # ------------------------------------------------------------------ attempts

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

    def attempts(self, run: str, last: int | None = None) -> list[AttemptRecord]:
        """The run's attempts in order; only the newest ``last`` when given."""
        rows = self._db.execute(
            "SELECT * FROM attempts WHERE run = ? ORDER BY seq DESC LIMIT ?", (run, -1 if last is None else last)
        ).fetchall()
        return [_attempt_from_row(r) for r in reversed(rows)]

    # ------------------------------------------------------------------ nodes

    def set_verdict(self, v: NodeVerdict) -> None:
        self._db.execute(
            "INSERT INTO nodes(name, verdict, reason, evidence, run, action, since, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET verdict = excluded.verdict,"
            " reason = excluded.reason, evidence = excluded.evidence, run = excluded.run,"
            " action = COALESCE(excluded.action, nodes.action), updated_at = excluded.updated_at",
            (v.node, v.verdict.value, v.reason, json.dumps(v.evidence), v.run, v.action, v.at, v.at),
        )

    def set_node_action(self, node: str, action: str, now: float) -> None:
        self._db.execute("UPDATE nodes SET action = ?, updated_at = ? WHERE name = ?", (action, now, node))

    def verdicts(self) -> list[NodeVerdict]:
        rows = self._db.execute("SELECT * FROM nodes ORDER BY since, name").fetchall()
        return [
            NodeVerdict(
                r["name"],
                Verdict(r["verdict"]),
                r["reason"],
                json.loads(r["evidence"]),
                r["run"],
                r["action"],
                r["since"],
            )
            for r in rows
        ]

    # ------------------------------------------------------------------ intent journal

    def begin_action(self, run: str, kind: str, params: Mapping[str, Any], now: float) -> int:
        cur = self._db.execute(
            "INSERT INTO actions(run, kind, params, status, created_at) VALUES (?, ?, ?, 'pending', ?)",
            (run, kind, json.dumps(params, sort_keys=True), now),
        )
        return int(cur.lastrowid or 0)

    def complete_action(self, action_id: int, status: str, result: Mapping[str, Any], now: float) -> None:
        self._db.execute(
            "UPDATE actions SET status = ?, result = ?, completed_at = ? WHERE id = ?",
            (status, json.dumps(result, sort_keys=True), now, action_id),
        )

    def open_actions(self) -> list[dict[str, Any]]:
        rows = self._db.execute("SELECT * FROM actions WHERE status = 'pending' ORDER BY id").fetchall()
        return [_action_row(r) for r in rows]

    def actions(self, run: str | None = None) -> list[dict[str, Any]]:
        sql, args = "SELECT * FROM actions ORDER BY id", cast(tuple[Any, ...], ())
        if run is not None:
            sql, args = "SELECT * FROM actions WHERE run = ? ORDER BY id", (run,)
        return [_action_row(r) for r in self._db.execute(sql, args).fetchall()]

    def action_done(self, run: str, kind: str, params: Mapping[str, Any]) -> bool:
        row = self._db.execute(
            "SELECT 1 FROM actions WHERE run = ? AND kind = ? AND params = ? AND status = 'done' LIMIT 1",
            (run, kind, json.dumps(params, sort_keys=True)),
        ).fetchone()
        return row is not None

    def node_changes_since(self, since: float, run: str | None = None) -> int:
        """Distinct nodes the supervisor set DOWN or DRAIN since ``since`` (the blast-radius count),
        in every run or in ``run``."""
        row = self._db.execute(
            "SELECT COUNT(DISTINCT json_extract(params, '$.node')) FROM actions WHERE kind = 'node_state'"
            " AND json_extract(params, '$.change') IN ('DOWN', 'DRAIN') AND status = 'done' AND completed_at >= ?"
            " AND (? IS NULL OR run = ?)",
            (since, run, run),
        ).fetchone()
        return int(row[0])

    # ------------------------------------------------------------------ logbook

    def record_event(self, e: Event) -> bool:
        """Append an event unless one with the same key exists. True when it was new."""
        cur = self._db.execute(
            "INSERT OR IGNORE INTO events(at, run, attempt, job_id, kind, message, evidence, actor, key)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                e.at,
                e.run,
                e.attempt,
                e.job_id,
                e.kind.value,
                e.message,
                json.dumps(e.evidence, default=str),
                e.actor,
                e.key,
            ),
        )
        return cur.rowcount == 1

    def events_of(self, run: str, kinds: tuple[EventKind, ...], limit: int | None = None) -> list[Event]:
        """The run's events of these kinds, oldest first; only the newest ``limit`` when given."""
        marks = ", ".join("?" for _ in kinds)
        rows = self._db.execute(
            f"SELECT * FROM events WHERE run = ? AND kind IN ({marks}) ORDER BY id DESC LIMIT ?",  # noqa: S608 - placeholders only
            (run, *[k.value for k in kinds], -1 if limit is None else limit),
        ).fetchall()
        return [_event_from_row(r) for r in reversed(rows)]

    def last_event(self, run: str, kinds: tuple[EventKind, ...]) -> Event | None:
        marks = ", ".join("?" for _ in kinds)
        row = self._db.execute(
            f"SELECT * FROM events WHERE run = ? AND kind IN ({marks}) ORDER BY id DESC LIMIT 1",  # noqa: S608 - placeholders only
            (run, *[k.value for k in kinds]),
        ).fetchone()
        return None if row is None else _event_from_row(row)

    def events(self, run: str | None = None) -> list[Event]:
        sql, args = "SELECT * FROM events ORDER BY id", cast(tuple[Any, ...], ())
        if run is not None:
            sql, args = "SELECT * FROM events WHERE run = ? ORDER BY id", (run,)
        return [_event_from_row(r) for r in self._db.execute(sql, args).fetchall()]

    # ------------------------------------------------------------------ helpers

    # ------------------------------------------------------------------ checkpoints

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

    def _run_from_row(self, row: sqlite3.Row) -> RunRecord:
        name = row["name"]
        a = self._db.execute("SELECT * FROM attempts WHERE run = ? ORDER BY seq DESC LIMIT 1", (name,)).fetchone()
        ex = self._db.execute(
            "SELECT node, reason, since, deferred FROM exclusions WHERE run = ? ORDER BY node", (name,)
        ).fetchall()
        return RunRecord(
            spec=_spec_from_json(json.loads(row["spec"])),
            state=RunState(row["state"]),
            restarts_spent=row["restarts_spent"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            cancel_requested=bool(row["cancel_requested"]),
            end_reason=row["end_reason"],
            attempt=None if a is None else _attempt_from_row(a),
            excluded={r["node"]: r["reason"] for r in ex if not r["deferred"]},
            deferred={r["node"]: (r["since"], r["reason"]) for r in ex if r["deferred"]},
        )


def _event_from_row(r: sqlite3.Row) -> Event:
    return Event(
        r["run"],
        EventKind(r["kind"]),
        r["message"],
        r["key"],
        r["at"],
        r["attempt"],
        r["job_id"],
        r["actor"],
        json.loads(r["evidence"]),
    )


def _attempt_from_row(r: sqlite3.Row) -> AttemptRecord:
    return AttemptRecord(
        run=r["run"],
        seq=r["seq"],
        job_id=r["job_id"],
        restart_count=r["restart_count"],
        submitted_at=r["submitted_at"],
        nodes=tuple(json.loads(r["nodes"] or "[]")),
        excluded=tuple(json.loads(r["excluded"] or "[]")),
        started_at=r["started_at"],
        ended_at=r["ended_at"],
        end_state=r["end_state"],
        end_reason=r["end_reason"],
        exit_code=r["exit_code"],
    )


def _action_row(r: sqlite3.Row) -> dict[str, Any]:
    return {
        "id": r["id"],
        "run": r["run"],
        "kind": r["kind"],
        "params": json.loads(r["params"]),
        "status": r["status"],
        "created_at": r["created_at"],
        "completed_at": r["completed_at"],
        "result": json.loads(r["result"]) if r["result"] else None,
    }


def _enable_wal(db: sqlite3.Connection, patience_s: float = 10.0) -> None:
    """Switch to WAL. Switching takes an exclusive lock and SQLite does not wait for it (the busy
    timeout does not apply): while another process creates or migrates the database — the daemon
    starting as `slurm-supervisor submit` runs — it answers "database is locked" at once. Retry."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


def _result_to_json(r: VerifyResult) -> dict[str, Any]:
    d = asdict(r)
    d["problems"] = [asdict(p) for p in r.problems]
    return d


def _result_from_json(text: str | None) -> VerifyResult | None:
    if not text:
        return None
    d = json.loads(text)
    return VerifyResult(
        **{
            **d,
            "level": Level(d["level"]),
            "outcome": Outcome(d["outcome"]),
            "guarantee": Guarantee(d["guarantee"]),
            "problems": tuple(ShardProblem(**p) for p in d["problems"]),
        }
    )


def _spec_to_json(spec: RunSpec) -> dict[str, Any]:
    d = asdict(spec)
    d["env"] = dict(spec.env)
    d["do_not_restart_exit_codes"] = sorted(spec.do_not_restart_exit_codes)
    return d


def _spec_from_json(d: dict[str, Any]) -> RunSpec:
    return RunSpec(
        **{
            **d,
            "sbatch_args": tuple(d["sbatch_args"]),
            "spare_nodes": tuple(d["spare_nodes"]),
            "spare_policy": SparePolicy(d["spare_policy"]),
            "restart_mode": RestartMode(d["restart_mode"]),
            "do_not_restart_exit_codes": frozenset(d["do_not_restart_exit_codes"]),
            "checkpoints": CheckpointPolicy(**d["checkpoints"]) if d.get("checkpoints") else None,
            "spikes": SpikePolicy(**d["spikes"]) if d.get("spikes") else SpikePolicy(),
        }
    )
