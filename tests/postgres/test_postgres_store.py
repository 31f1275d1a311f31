"""What the contract suite does not pin, on the PostgreSQL store: the rest of the port answered as
SQLite answers it (one script of calls, both stores, every answer compared), names that are hostile
or sort differently under a locale, the writer lock, migrations raced and refused, read-only readers."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from supervisor.adapters.postgres import PostgresStore
from supervisor.adapters.postgres.schema import SCHEMA_VERSION, SchemaMismatch, SchemaTooNew, migrate
from supervisor.adapters.sqlite import SqliteStore
from supervisor.domain.alloc_step import LauncherReport, StepGoal
from supervisor.domain.checkpoints.manifest import CheckpointRef, Guarantee, Level, Outcome, VerifyResult
from supervisor.domain.decide.blast import NodeChangeRecord
from supervisor.domain.health.findings import NodeFinding, Severity
from supervisor.domain.progress.series import ProgressPoint
from supervisor.domain.records import Event, EventKind, NodeVerdict, Verdict
from supervisor.domain.run import RestartMode
from supervisor.testing.kit.specs import spec

pytestmark = pytest.mark.postgres

HOSTILE = ["a'; DROP TABLE runs; --", 'b"quoted"', "B-upper", "_under", "ä-umlaut", "n\\back", "%s-percent"]


def _script(store: Any) -> list[Any]:
    """Calls over the store's whole surface; what each answered."""
    seen: list[Any] = []
    for i, name in enumerate(HOSTILE):
        store.add_run(spec(name=name), 1.0)  # the same time: the names alone decide the order
        store.exclude(name, f"n'{i}", "dead", 2.0)
        store.defer(name, "n%", "slow", 2.0)
    seen.append([r.name for r in store.runs()])
    alloc = spec(name="alloc", restart_mode=RestartMode.IN_ALLOCATION)
    store.add_run(alloc, 3.0)
    store.add_attempt("alloc", 7, 0, 3.0)
    store.channel_listening(3.5)
    store.set_step_goal("alloc", StepGoal(7, 1, ("n1", "n3"), "n2 died", 4.0))
    dead = LauncherReport(7, 1, False, ("n1", "n3"), "n1", 5.0, 1)
    store.launcher_reported("alloc", dead)
    store.launcher_reported("alloc", LauncherReport(7, 1, False, ("n1", "n3"), "n1", 6.0, 1))  # death repeated
    seen += [store.launcher_report("alloc", 7), store.get_run("alloc").step]
    for step, committed in ((None, False), (100, True), (200, False)):
        ref = CheckpointRef(f"/c/{step}", f"s{step}", step, Guarantee.MANIFEST, committed=committed, seen_at=5.0)
        store.checkpoint_seen("alloc", ref, 6.0)
    result = VerifyResult("/c/100", 100, Level.FULL, Outcome.VERIFIED, "ok", shards=10, bytes=1000)
    store.checkpoint_result("alloc", result)
    store.demote_checkpoint("alloc", "/c/200", "torn")
    seen += [store.checkpoints("alloc"), store.checkpoints("alloc", limit=1)]
    store.set_verdict(NodeVerdict("n1", Verdict.BAD, "XID 79", {"xid": 79}, "alloc", "drain", 7.0))
    store.set_verdict(NodeVerdict("n1", Verdict.BAD, "XID 79 again", {"xid": 79}, "alloc", None, 8.0))
    store.set_node_action("n1", "down", 9.0)
    store.clear_quarantine("n1", 9.0, "root", "replaced the GPU")
    store.clear_quarantine("n1", 9.5, "root", "again")
    store.record_node_change(NodeChangeRecord("n1", "alloc", "DRAIN", 9.0, "bad", intent=None))
    finding = NodeFinding("n2", Severity.DEGRADED, "slow", "k", 9.0, run="alloc")
    store.keep_findings([finding, finding])
    seen += [store.verdicts(), store.quarantine_clears(), store.node_changes(0.0), store.active_findings()]
    store.progress_limit = 3
    store.record_progress([ProgressPoint("alloc", 0, s, float(s), loss=1.0 / (s + 1)) for s in range(8)])
    seen.append(store.progress("alloc"))
    for n in range(5):
        store.record_event(Event("alloc", EventKind.NOTE, f"note {n}", f"k{n}", 10.0 + n, evidence={"n": n}))
    first, batch = store.events_after(0, limit=2)
    seen += [first, batch, store.events_after(first), store.last_event_id()]
    seen += [store.events_of("alloc", (EventKind.NOTE,), limit=2), store.last_event("alloc", (EventKind.NOTE,))]
    store.attempt_load_failed("alloc", 0, "torn shard")
    store.attempt_load_failed("alloc", 0, "OOM", before_load=True)
    store.attempt_continued("alloc", 0, "/c/100")
    seen += [store.attempts("alloc"), sorted(store.active_tokens()) == sorted({store.run_token("alloc"): 0})]
    return seen


def test_the_rest_of_the_port_answers_as_sqlite_does(postgres, tmp_path: Path) -> None:
    sqlite = SqliteStore(tmp_path)
    pg = PostgresStore(postgres.url, password=postgres.password)
    try:
        on_sqlite, on_postgres = _script(sqlite), _script(pg)
        for i, (want, got) in enumerate(zip(on_sqlite, on_postgres, strict=True)):
            assert got == want, f"answer {i}"
        assert [r.name for r in pg.runs() if r.name in HOSTILE] == sorted(HOSTILE)  # code-point (byte) order
        sorted_by = (
            "SELECT collation_name AS c FROM information_schema.columns WHERE table_name = %s AND column_name = %s"
        )
        for table, column in (("runs", "name"), ("nodes", "name"), ("exclusions", "node"), ("node_findings", "node")):
            row = pg._one(sorted_by, (table, column))  # whatever the database's locale
            assert row is not None and row["c"] == "C", (table, column)
        assert pg.get_run(HOSTILE[0]).excluded == {"n'0": "dead"}  # the name was a value, never SQL
    finally:
        sqlite.close()
        pg.close()


def test_the_logbook_refuses_updates_and_deletes(postgres) -> None:
    store = PostgresStore(postgres.url, password=postgres.password)
    store.record_event(Event("r", EventKind.NOTE, "kept", "k", 1.0))
    for statement in ("UPDATE events SET message = 'changed'", "DELETE FROM events", "TRUNCATE events"):
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            store._db.execute(statement)
    assert [e.message for e in store.events()] == ["kept"]
    store.close()


def test_a_write_waits_while_another_connection_holds_a_transaction(postgres) -> None:
    first = PostgresStore(postgres.url, password=postgres.password)
    second = PostgresStore(postgres.url, password=postgres.password)
    first.add_run(spec(name="r"), 1.0)
    done = threading.Event()

    def write() -> None:
        second.exclude("r", "n2", "dead", 2.0)
        done.set()

    with first.transaction():
        first.exclude("r", "n1", "dead", 2.0)
        writer = threading.Thread(target=write)
        writer.start()
        _wait_for_lock_wait(first, second)
        assert not done.is_set()
    writer.join(10.0)
    assert done.is_set() and first.get_run("r").excluded.keys() == {"n1", "n2"}
    first.close()
    second.close()


def _wait_for_lock_wait(observer: PostgresStore, waiting: PostgresStore) -> None:
    pid = waiting._db.info.backend_pid
    other = psycopg.connect(observer._db.info.dsn, password=observer._db.info.password, autocommit=True)
    try:
        for _ in range(200):
            row = other.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
            if row and row[0] == "Lock":
                return
            threading.Event().wait(0.02)
        raise AssertionError("the second writer never waited for the writer lock")
    finally:
        other.close()


def test_migrations_raced_by_two_processes_run_once(postgres) -> None:
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            PostgresStore(postgres.url, password=postgres.password).close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30.0)
    assert errors == []
    with psycopg.connect(postgres.url, password=postgres.password) as db:
        rows = db.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()
        assert [r[0] for r in rows] == list(range(1, SCHEMA_VERSION + 1))


def test_a_newer_schema_is_refused_and_a_reader_never_migrates(postgres) -> None:
    with psycopg.connect(postgres.url, password=postgres.password, autocommit=True) as db:
        migrate(db, target=SCHEMA_VERSION - 1)
    with pytest.raises(SchemaMismatch, match="store migrate"):
        PostgresStore(postgres.url, password=postgres.password, read_only=True)
    PostgresStore(postgres.url, password=postgres.password).close()  # the daemon migrates
    reader = PostgresStore(postgres.url, password=postgres.password, read_only=True)
    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        reader.add_run(spec(name="r"), 1.0)
    reader.close()
    with psycopg.connect(postgres.url, password=postgres.password, autocommit=True) as db:
        db.execute("INSERT INTO schema_migrations(version) VALUES (%s)", (SCHEMA_VERSION + 1,))
    with pytest.raises(SchemaTooNew, match="newer"):
        PostgresStore(postgres.url, password=postgres.password)


def test_a_connection_the_server_ended_while_idle_is_replaced_before_the_next_statement(postgres) -> None:
    """A restarted server (or pg_terminate_backend) ends every idle connection; the daemon's API
    answered the first read after a database outage with that error. The store finds the ended
    connection before using it and opens a new one: no statement fails for it."""
    store = PostgresStore(postgres.url, password=postgres.password)
    store.add_run(spec(name="r"), 1.0)
    ended = store._db.info.backend_pid
    admin = psycopg.connect(postgres.url, password=postgres.password, autocommit=True)
    try:
        admin.execute("SELECT pg_terminate_backend(%s)", (ended,))
        for _ in range(100):  # until the server has ended it
            if not admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (ended,)).fetchone():
                break
            threading.Event().wait(0.02)
    finally:
        admin.close()
    assert [r.name for r in store.runs()] == ["r"]  # a read, on a new connection
    store.exclude("r", "n1", "dead", 2.0)  # and a write
    assert store._db.info.backend_pid != ended
    store.close()


def test_a_nul_in_any_text_is_kept_as_a_replacement_character_not_refused(postgres) -> None:
    """PostgreSQL refuses U+0000 in text (SQLite keeps it): a NUL from Slurm's output, a node's
    reason or a run's name would have failed the whole write — the tick, every tick. It is kept
    as U+FFFD instead, in single statements and in batches alike."""
    store = PostgresStore(postgres.url, password=postgres.password)
    store.add_run(spec(name="r"), 1.0)
    store.record_event(Event("r", EventKind.NOTE, "sbatch said: a\x00b", "r:note:\x00", 1.0))
    store.exclude("r", "n1", "reason \x00", 2.0)
    [event] = store.events("r")
    assert (event.message, event.key) == ("sbatch said: a\ufffdb", "r:note:\ufffd")
    assert store.get_run("r").excluded == {"n1": "reason \ufffd"}
    store.close()
