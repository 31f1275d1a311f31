import sqlite3

import pytest

from supervisor.adapters.sqlite_schema import SCHEMA_VERSION, SchemaTooNew, migrate
from supervisor.adapters.sqlite_store import SqliteStore
from supervisor.domain.records import Event, EventKind
from supervisor.domain.run import IllegalTransition, RunSpec, RunState
from supervisor.ports import PermanentError


def spec(name="r1"):
    return RunSpec(name=name, script="/x.sh", partition="main", nodes=2, spare_nodes=("n4",))


def test_wal_and_schema_version(tmp_path):
    store = SqliteStore(tmp_path)
    db = sqlite3.connect(store.path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_migration_is_idempotent_and_refuses_newer(tmp_path):
    SqliteStore(tmp_path).close()
    db = sqlite3.connect(tmp_path / "supervisor.db", isolation_level=None)
    assert migrate(db) == SCHEMA_VERSION
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(SchemaTooNew, match="newer"):
        migrate(db)


def test_run_roundtrip_and_state_machine(tmp_path):
    store = SqliteStore(tmp_path)
    store.add_run(spec(), now=1.0)
    with pytest.raises(PermanentError, match="already supervised"):
        store.add_run(spec(), now=2.0)
    run = store.get_run("r1")
    assert run.spec == spec() and run.state is RunState.REGISTERED
    store.set_state("r1", RunState.QUEUED, 2.0)
    with pytest.raises(IllegalTransition):
        store.set_state("r1", RunState.REGISTERED, 3.0)
    store.set_state("r1", RunState.RUNNING, 3.0)
    store.set_state("r1", RunState.RECOVERING, 4.0)
    store.set_state("r1", RunState.QUEUED, 5.0, spend_restart=True)
    assert store.get_run("r1").restarts_spent == 1


def test_attempts_are_unique_per_incarnation(tmp_path):
    store = SqliteStore(tmp_path)
    store.add_run(spec(), 1.0)
    a0 = store.add_attempt("r1", 100, 0, 1.0)
    again = store.add_attempt("r1", 100, 0, 2.0)
    a1 = store.add_attempt("r1", 100, 1, 3.0, excluded=("n1",))
    assert (a0.seq, again.seq, a1.seq) == (0, 0, 1)
    store.attempt_started("r1", 1, ("n2", "n3"), 4.0)
    store.attempt_ended("r1", 0, 5.0, "REQUEUED", "node fault", None)
    store.attempt_ended("r1", 0, 9.0, "X", "late duplicate", None)
    rows = store.attempts("r1")
    assert rows[0].end_state == "REQUEUED" and rows[0].ended_at == 5.0
    assert store.get_run("r1").attempt.nodes == ("n2", "n3")


def test_events_are_idempotent_and_append_only(tmp_path):
    store = SqliteStore(tmp_path)
    store.add_run(spec(), 1.0)
    e = Event("r1", EventKind.FAULT, "fault on n1", "r1:0:fault:n1", 2.0, 0, 100, evidence={"node": "n1"})
    assert store.record_event(e) is True
    assert store.record_event(e) is False
    assert [x.message for x in store.events("r1")] == ["fault on n1"]
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        store._db.execute("DELETE FROM events")


def test_intent_journal(tmp_path):
    store = SqliteStore(tmp_path)
    store.add_run(spec(), 1.0)
    aid = store.begin_action("r1", "node_state", {"node": "n1", "change": "DOWN"}, 2.0)
    assert [a["id"] for a in store.open_actions()] == [aid]
    store.complete_action(aid, "done", {"ok": True}, 3.0)
    assert store.open_actions() == []
    assert store.action_done("r1", "node_state", {"change": "DOWN", "node": "n1"})
    assert store.node_changes_since(2.5) == 1 and store.node_changes_since(3.5) == 0


def test_data_survives_reopen(tmp_path):
    store = SqliteStore(tmp_path)
    store.add_run(spec(), 1.0)
    store.exclude("r1", "n1", "dead", 2.0)
    store.close()
    again = SqliteStore(tmp_path)
    assert again.get_run("r1").excluded == {"n1": "dead"}


def test_one_daemon_per_state_directory(tmp_path):
    from supervisor.adapters.lock import AlreadyRunning, StateDirLock

    with (
        StateDirLock(tmp_path),
        pytest.raises(AlreadyRunning, match="another slurm-supervisor daemon"),
        StateDirLock(tmp_path),
    ):
        pass
    with StateDirLock(tmp_path):  # released on exit
        pass


def test_instance_id_is_stable_and_distinct(tmp_path):
    a = SqliteStore(tmp_path / "a")
    b = SqliteStore(tmp_path / "b")
    assert len(a.instance_id) == 8 and a.instance_id != b.instance_id
    assert SqliteStore(tmp_path / "a").instance_id == a.instance_id


def test_concurrent_first_opens_migrate_once(tmp_path):
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        ids = pool.map(_open_store, [str(tmp_path)] * 8)
    assert len(set(ids)) == 1


def _open_store(path):
    return SqliteStore(path).instance_id


def test_an_ended_run_keeps_its_name_and_logbook(tmp_path):
    # Re-registering a name would pair the new run with the old one's attempts and make its
    # logbook keys collide with the old entries (so new entries would be dropped): refused.
    store = SqliteStore(tmp_path)
    store.add_run(spec(), 1.0)
    store.add_attempt("r1", 100, 0, 1.0)
    store.record_event(Event("r1", EventKind.SUBMITTED, "submitted", "r1:0:submitted:", 1.0, 0, 100))
    store.set_state("r1", RunState.QUEUED, 2.0)
    store.set_state("r1", RunState.FAILED, 3.0, reason="gave up")
    with pytest.raises(PermanentError, match=r"already exists \(failed\).*r1-2"):
        store.add_run(spec(), 4.0)
    run = store.get_run("r1")
    assert run.state is RunState.FAILED and run.attempt.job_id == 100
