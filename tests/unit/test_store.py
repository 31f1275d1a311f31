import sqlite3

import pytest

from supervisor.adapters.sqlite import SqliteStore
from supervisor.adapters.sqlite.schema import SCHEMA_VERSION, SchemaTooNew, migrate
from supervisor.domain.decide.blast import NodeChangeRecord
from supervisor.domain.health.quarantine import Fault
from supervisor.domain.records import Event, EventKind
from supervisor.domain.spikes.rollback import SkipRange
from supervisor.testing.kit.specs import spec


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


def test_the_logbook_is_append_only(tmp_path):
    store = SqliteStore(tmp_path)
    store.add_run(spec(), 1.0)
    store.record_event(Event("llm", EventKind.FAULT, "fault on n1", "llm:0:fault:n1", 2.0, 0, 100))
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        store._db.execute("DELETE FROM events")


def test_an_older_database_is_carried_over_into_the_typed_tables(tmp_path):
    """Schema 5 kept faults, node changes and rollbacks only as logbook evidence and action
    parameters: migration 6 carries them over once."""
    db = sqlite3.connect(tmp_path / "supervisor.db", isolation_level=None)
    for statement in _statements_up_to(5):
        db.execute(statement)
    db.execute("PRAGMA user_version = 5")
    db.execute(
        "INSERT INTO events(at, run, attempt, kind, message, evidence, actor, key) VALUES"
        " (2.0, 'r1', 0, 'fault', 'm', '{\"node\": \"n1\", \"observed\": \"XID 79\"}', 's', 'k1'),"
        " (3.0, 'r1', 0, 'rollback', 'm', '{\"onset_step\": 500, \"checkpoint_step\": 400,"
        ' "skip_first": 401, "skip_last": 700, "lr_scale": 0.5}\', \'s\', \'k2\')'
    )
    db.execute(
        "INSERT INTO actions(run, kind, params, status, created_at, completed_at) VALUES"
        ' (\'r1\', \'node_state\', \'{"node": "n1", "change": "DRAIN", "reason": "x"}\', \'done\', 2.0, 2.5)'
    )
    db.close()
    store = SqliteStore(tmp_path)
    assert store.node_faults(0.0) == [Fault("n1", 2.0, "r1", "XID 79", key="k1")]
    assert store.node_changes(0.0) == [NodeChangeRecord("n1", "r1", "DRAIN", 2.5, "x", intent=1)]
    [rollback] = store.rollbacks("r1")
    assert (rollback.checkpoint_step, rollback.skip, rollback.lr_scale) == (400, SkipRange(401, 700), 0.5)


def _statements_up_to(version: int) -> list[str]:
    from supervisor.adapters.sqlite.schema import MIGRATIONS, _statements

    return [s for script in MIGRATIONS[:version] for s in _statements(script)]


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


def test_concurrent_first_opens_migrate_once(tmp_path):
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        ids = pool.map(_open_store, [str(tmp_path)] * 8)
    assert len(set(ids)) == 1


def _open_store(path):
    return SqliteStore(path).instance_id
