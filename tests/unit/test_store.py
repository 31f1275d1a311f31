import sqlite3
from dataclasses import replace

import pytest

from supervisor.adapters.sqlite import SqliteStore
from supervisor.adapters.sqlite.schema import SCHEMA_VERSION, SchemaTooNew, migrate
from supervisor.domain.decide.blast import NodeChangeRecord
from supervisor.domain.health.findings import NodeFinding, Severity
from supervisor.domain.health.quarantine import Fault
from supervisor.domain.progress.hang import HangPace
from supervisor.domain.records import Event, EventKind
from supervisor.domain.run import IllegalTransition, RunSpec, RunState
from supervisor.domain.spikes.rollback import RollbackRecord, RollbackStatus, SkipRange
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


def test_typed_records_the_engine_reads_back_are_stored_once_and_read_back_whole(tmp_path):
    store = SqliteStore(tmp_path)
    store.add_run(spec(), 1.0)
    fault = Fault("n1", 2.0, "r1", "XID 79", key="r1:0:fault:n1")
    store.record_node_fault(fault)
    store.record_node_fault(replace(fault, at=2.5))  # the same fault decided again after a crash
    assert store.node_faults(0.0) == [fault] and store.node_faults(2.1) == []
    change = NodeChangeRecord("n1", "r1", "DOWN", 3.0, "dead", intent=7)
    store.record_node_change(change)
    store.record_node_change(replace(change, at=3.5))
    assert store.node_changes(2.5) == [change] and store.node_changes(3.5) == []
    planned = RollbackRecord("r1", 0, 500, RollbackStatus.PLANNED, 4.0, "why", 400, SkipRange(401, 700), 0.5, 1)
    store.record_rollback(planned)
    store.record_rollback(RollbackRecord("r1", 1, 900, RollbackStatus.BLOCKED, 5.0, "no checkpoint"))
    assert store.rollbacks("r1")[0] == planned
    store.rollbacks_done("r1", before_attempt=1)
    assert [r.status for r in store.rollbacks("r1")] == [RollbackStatus.DONE, RollbackStatus.BLOCKED]
    store.add_attempt("r1", 100, 0, 1.0)
    pace = HangPace(((60.0, 10), (61.5, 10)), (10, 10))
    store.attempt_progress("r1", 0, 1234, 6.5, pace)
    a = store.get_run("r1").attempt
    assert (a.last_step, a.step_time_s, a.hang_pace) == (1234, 6.5, pace)
    finding = NodeFinding("n1", Severity.FATAL, "XID 79", "xid-79@1", 6.0, run="r1", evidence={"gpu": 3})
    store.keep_findings([finding])
    assert store.active_findings() == {"n1": finding}
    store.keep_findings([])
    assert store.active_findings() == {}


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
