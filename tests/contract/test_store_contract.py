"""One contract for the store port (``supervisor.ports.Store``), run against every store.

Every case runs once per implementation through the ``world`` fixture: ``sqlite`` (``SqliteStore``
on a temporary state directory) and ``postgres`` (``PostgresStore`` on a fresh database of the
private server the harness starts, ``supervisor.testing.servers.postgres``; marker ``postgres``). A case
speaks to the port only; what differs between stores — where one lives, how
an older schema is planted — is each world's (``StoreWorld``).

Pinned: idempotent keys (what the daemon may write again after a crash changes nothing), nested
transactions (``ports.RunStore.transaction``), the run-state table enforced on every write, schema
migrations, the intent journal's open/close semantics (``ports.Intent``), and the leader lease
with its fence: the epoch only grows, and every write of an older epoch is refused and leaves
nothing (``ports.LeaderLease``, issue 33).
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from supervisor.adapters.postgres import PostgresStore
from supervisor.adapters.sqlite import SqliteStore
from supervisor.api.testing import single_user_store
from supervisor.domain.alloc_step import StepGoal
from supervisor.domain.checkpoints.manifest import CheckpointRef, Guarantee
from supervisor.domain.checkpoints.resume import ResumePlan
from supervisor.domain.decide.blast import NodeChangeRecord
from supervisor.domain.health.findings import NodeFinding, Severity
from supervisor.domain.health.ladder import NodeCare, Rung
from supervisor.domain.health.quarantine import Fault
from supervisor.domain.progress.hang import HangPace
from supervisor.domain.records import Event, EventKind
from supervisor.domain.run import TRANSITIONS, IllegalTransition, RunState
from supervisor.domain.spikes.rollback import RollbackRecord, RollbackStatus, SkipRange
from supervisor.ports import Intent, NotLeading, PermanentError, Store
from supervisor.testing.kit.specs import spec
from supervisor.testing.servers.postgres import Databases

RUN = "llm"


class Boom(Exception):
    """Raised inside a transaction to see what it leaves behind."""


# ---------------------------------------------------------------------------- the stores


class StoreWorld:
    """What a contract case needs of one store implementation."""

    kind: str

    def open(self) -> Store:
        """The store on this world's place, opened (again): a second open sees what the first wrote."""
        raise NotImplementedError

    def close(self, store: Store) -> None:
        raise NotImplementedError

    def plant_previous_schema(self, run: str, state: RunState) -> None:
        """This world's place as the previous schema left it, holding one run in ``state``."""
        raise NotImplementedError

    def elsewhere(self) -> StoreWorld:
        """Another, empty place of the same kind (another daemon's store)."""
        raise NotImplementedError


class SqliteWorld(StoreWorld):
    kind = "sqlite"

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir

    def open(self) -> Store:
        return SqliteStore(self.state_dir)

    def close(self, store: Store) -> None:
        assert isinstance(store, SqliteStore)
        store.close()

    def plant_previous_schema(self, run: str, state: RunState) -> None:
        single_user_store(self.state_dir, run=run, state=state.value)  # schema 9: runs had no owner

    def elsewhere(self) -> StoreWorld:
        return SqliteWorld(self.state_dir.with_name(self.state_dir.name + "-elsewhere"))


class PostgresWorld(StoreWorld):
    """A database of its own on the session's server; ``elsewhere`` is another database there."""

    kind = "postgres"

    def __init__(self, databases: Databases, url: str) -> None:
        self.databases, self.url = databases, url

    def open(self) -> Store:
        return PostgresStore(self.url, password=self.databases.password)

    def close(self, store: Store) -> None:
        assert isinstance(store, PostgresStore)
        store.close()

    def plant_previous_schema(self, run: str, state: RunState) -> None:
        import psycopg

        from supervisor.adapters.postgres.schema import SCHEMA_VERSION, migrate
        from supervisor.adapters.store_rows import spec_to_json

        with psycopg.connect(self.url, password=self.databases.password, autocommit=True) as db:
            migrate(db, target=SCHEMA_VERSION - 1)
            db.execute(
                "INSERT INTO runs(name, spec, state, restarts_spent, created_at, updated_at)"
                " VALUES (%s, %s, %s, 1, 1.0, 2.0)",
                (run, json.dumps(spec_to_json(spec(name=run))), state.value),
            )

    def elsewhere(self) -> StoreWorld:
        return PostgresWorld(self.databases, self.databases.new())


@pytest.fixture(params=[pytest.param("sqlite", id="sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> StoreWorld:
    if request.param == "postgres":
        databases = request.getfixturevalue("postgres")
        return PostgresWorld(databases, databases.url)
    return SqliteWorld(tmp_path / "state")


@pytest.fixture
def store(world: StoreWorld) -> Iterator[Store]:
    opened = world.open()
    opened.add_run(spec(name=RUN), 1.0)
    yield opened
    world.close(opened)


def reopened(world: StoreWorld, store: Store) -> Store:
    """The daemon restarted: its store closed and opened again on the same place."""
    world.close(store)
    return world.open()


# ---------------------------------------------------------------------------- idempotent keys


def test_an_event_is_written_once_per_key(store: Store) -> None:
    event = Event(RUN, EventKind.FAULT, "fault on n1", f"{RUN}:0:fault:n1", 2.0, 0, 100, evidence={"node": "n1"})
    assert store.record_event(event) is True
    assert store.record_event(replace(event, message="decided again after a crash", at=3.0)) is False
    assert store.events(RUN) == [event]


def test_an_attempt_is_one_per_incarnation_of_a_job(store: Store) -> None:
    first = store.add_attempt(RUN, 100, 0, 1.0)
    again = store.add_attempt(RUN, 100, 0, 2.0)
    requeued = store.add_attempt(RUN, 100, 1, 3.0, excluded=("n1",))
    assert (first.seq, again.seq, requeued.seq) == (0, 0, 1)
    assert again.submitted_at == 1.0 and requeued.excluded == ("n1",)


def test_an_attempt_ends_once(store: Store) -> None:
    store.add_attempt(RUN, 100, 0, 1.0)
    store.attempt_started(RUN, 0, ("n2", "n3"), 4.0)
    store.attempt_ended(RUN, 0, 5.0, "REQUEUED", "node fault", None)
    store.attempt_ended(RUN, 0, 9.0, "X", "late duplicate", None)
    [attempt] = store.attempts(RUN)
    assert (attempt.end_state, attempt.ended_at, attempt.nodes) == ("REQUEUED", 5.0, ("n2", "n3"))


def test_a_successor_is_one_per_run_kept_across_a_restart_and_dropped_by_its_job(
    world: StoreWorld, store: Store
) -> None:
    from supervisor.domain.records import Successor

    first = Successor(200, 0, 3.0, ("n1",))
    store.set_successor(RUN, first)
    store.set_successor(RUN, first)  # journaled intent settled twice: still one
    store = reopened(world, store)
    assert store.get_run(RUN).successor == first
    store.drop_successor(RUN, 999)  # another job's drop leaves it
    assert store.get_run(RUN).successor == first
    store.drop_successor(RUN, 200)
    store.drop_successor(RUN, 200)
    assert store.get_run(RUN).successor is None
    world.close(store)


def test_a_checkpoint_needs_verifying_when_new_or_changed(store: Store) -> None:
    torn = CheckpointRef("/ckpt/step_100", "step_100", 100, Guarantee.MANIFEST, committed=False, seen_at=5.0)
    assert store.checkpoint_seen(RUN, torn, 6.0) is True
    assert store.checkpoint_seen(RUN, torn, 7.0) is False
    assert store.checkpoint_seen(RUN, replace(torn, committed=True), 8.0) is True  # its commit marker appeared
    assert store.checkpoint_state(RUN, torn.location) == (True, 5.0)


def test_faults_node_changes_rollbacks_and_resume_plans_are_kept_once_per_key(store: Store) -> None:
    fault = Fault("n1", 2.0, RUN, "XID 79", key=f"{RUN}:0:fault:n1")
    store.record_node_fault(fault)
    store.record_node_fault(replace(fault, at=2.5))
    change = NodeChangeRecord("n1", RUN, "DOWN", 3.0, "dead", intent=7)
    store.record_node_change(change)
    store.record_node_change(replace(change, at=3.5))
    planned = RollbackRecord(RUN, 0, 500, RollbackStatus.PLANNED, 4.0, "why", 400, SkipRange(401, 700), 0.5, 1)
    store.record_rollback(planned)
    store.record_rollback(replace(planned, at=4.5))
    plan = ResumePlan(None, reason="nothing verified yet")
    store.record_resume_plan(RUN, 0, plan)
    store.record_resume_plan(RUN, 0, replace(plan, reason="decided again"))
    assert store.node_faults(0.0) == [fault] and store.node_faults(2.1) == []
    assert store.node_changes(2.5) == [change] and store.node_changes(3.5) == []
    assert store.rollbacks(RUN) == [planned]
    assert store.resume_plans(RUN, 5) == {0: plan}


def test_a_step_goal_is_written_once_per_generation(store: Store) -> None:
    goal = StepGoal(7, 1, ("n1", "n3"), "n2 died", 100.0)
    assert store.set_step_goal(RUN, goal) is True
    assert store.set_step_goal(RUN, replace(goal, nodes=("n1", "n4"))) is False
    assert store.step_goal(RUN, 7) == goal
    assert store.set_step_goal(RUN, replace(goal, generation=2, nodes=("n1", "n4"))) is True
    assert store.step_goal(RUN, 7) == replace(goal, generation=2, nodes=("n1", "n4"))


def test_a_run_name_is_registered_once_even_after_it_ended(store: Store) -> None:
    with pytest.raises(PermanentError, match="already supervised"):
        store.add_run(spec(name=RUN), 2.0)
    store.set_state(RUN, RunState.CANCELLED, 3.0, reason="by hand")
    with pytest.raises(PermanentError, match="already exists"):
        store.add_run(spec(name=RUN), 4.0)
    assert store.get_run(RUN) is not None and store.get_run(RUN).state is RunState.CANCELLED


def test_a_run_token_is_made_once(world: StoreWorld, store: Store) -> None:
    token = store.run_token(RUN)
    assert len(token) >= 32 and store.run_token(RUN) == token
    assert reopened(world, store).run_token(RUN) == token


# ---------------------------------------------------------------------------- transactions


def test_a_transaction_keeps_all_of_its_writes_or_none(store: Store) -> None:
    with pytest.raises(Boom), store.transaction():
        store.exclude(RUN, "n1", "dead", 2.0)
        store.record_event(Event(RUN, EventKind.FAULT, "n1 dead", "k1", 2.0))
        raise Boom
    assert store.get_run(RUN).excluded == {} and store.events(RUN) == []
    with store.transaction():
        store.exclude(RUN, "n1", "dead", 2.0)
        store.record_event(Event(RUN, EventKind.FAULT, "n1 dead", "k1", 2.0))
    assert store.get_run(RUN).excluded == {"n1": "dead"} and len(store.events(RUN)) == 1


def test_a_nested_transaction_joins_the_open_one(store: Store) -> None:
    """The inner block commits nothing by itself: the outer block's failure undoes it too."""
    with pytest.raises(Boom), store.transaction():
        with store.transaction():
            store.exclude(RUN, "n1", "dead", 2.0)
            store.set_state(RUN, RunState.QUEUED, 2.0)
        assert store.get_run(RUN).state is RunState.QUEUED  # the outer block reads the inner writes
        raise Boom
    run = store.get_run(RUN)
    assert run.state is RunState.REGISTERED and run.excluded == {}


def test_a_failure_in_a_nested_block_undoes_the_whole_transaction(store: Store) -> None:
    with pytest.raises(Boom), store.transaction():
        store.exclude(RUN, "n1", "dead", 2.0)
        with store.transaction():
            store.exclude(RUN, "n2", "dead", 2.0)
            raise Boom
    assert store.get_run(RUN).excluded == {}


# ---------------------------------------------------------------------------- the run-state table


def _path_to(target: RunState) -> list[RunState]:
    """The shortest run of legal transitions from REGISTERED to ``target`` (breadth first)."""
    came_from: dict[RunState, RunState | None] = {RunState.REGISTERED: None}
    todo = deque([RunState.REGISTERED])
    while todo:
        state = todo.popleft()
        for step in sorted(TRANSITIONS[state]):
            if step not in came_from:
                came_from[step], _ = state, todo.append(step)
    path: list[RunState] = []
    at: RunState | None = target
    while at is not None and at is not RunState.REGISTERED:
        path.append(at)
        at = came_from[at]
    return path[::-1]


@pytest.mark.parametrize("source", list(RunState), ids=str)
def test_every_transition_the_table_refuses_raises_and_changes_nothing(store: Store, source: RunState) -> None:
    for step in _path_to(source):
        store.set_state(RUN, step, 2.0)
    refused = set(RunState) - TRANSITIONS[source] - {source}
    for target in sorted(refused):
        with pytest.raises(IllegalTransition):
            store.set_state(RUN, target, 3.0, reason="should not stick")
    run = store.get_run(RUN)
    assert run.state is source and run.updated_at == (2.0 if source is not RunState.REGISTERED else 1.0)


@pytest.mark.parametrize("source", [s for s in RunState if TRANSITIONS[s]], ids=str)
def test_every_transition_the_table_allows_is_taken(world: StoreWorld, source: RunState) -> None:
    store = world.open()
    try:
        for target in sorted(TRANSITIONS[source]):
            name = f"{source}-{target}"
            store.add_run(spec(name=name), 1.0)
            for step in _path_to(source):
                store.set_state(name, step, 2.0)
            store.set_state(name, target, 3.0, reason="ended" if target.terminal else None, spend_restart=True)
            run = store.get_run(name)
            assert (run.state, run.restarts_spent) == (target, 1)
            assert run.end_reason == ("ended" if target.terminal else None)
    finally:
        world.close(store)


def test_setting_the_state_a_run_is_in_is_no_transition(store: Store) -> None:
    store.set_state(RUN, RunState.REGISTERED, 2.0)
    assert store.get_run(RUN).state is RunState.REGISTERED


def test_the_state_of_an_unknown_run_cannot_be_set(store: Store) -> None:
    with pytest.raises(PermanentError, match="unknown run"):
        store.set_state("nobody", RunState.QUEUED, 2.0)
    with pytest.raises(PermanentError, match="unknown run"):
        store.request_cancel("nobody", 2.0)


# ---------------------------------------------------------------------------- migrations


def test_a_store_on_the_previous_schema_is_migrated_and_keeps_its_runs(world: StoreWorld) -> None:
    world.plant_previous_schema("legacy", RunState.COMPLETED)
    store = world.open()
    try:
        legacy = store.get_run("legacy")
        assert legacy is not None and legacy.state is RunState.COMPLETED and legacy.restarts_spent == 1
        store.add_run(spec(name="new"), 3.0)  # every table of this schema is there
        store.add_attempt("new", 100, 0, 3.0)
        store.begin_action("new", "submit", {"nonce": "x"}, 3.0)
        assert [r.name for r in store.runs()] == ["legacy", "new"]
    finally:
        world.close(store)


def test_opening_a_store_again_migrates_nothing_and_loses_nothing(world: StoreWorld, store: Store) -> None:
    store.exclude(RUN, "n1", "dead", 2.0)
    store.add_attempt(RUN, 100, 0, 2.0)
    store.record_event(Event(RUN, EventKind.SUBMITTED, "submitted", "k1", 2.0, 0, 100))
    instance, before = store.instance_id, store.get_run(RUN)
    again = reopened(world, store)
    twice = reopened(world, again)
    assert twice.instance_id == instance and twice.get_run(RUN) == before
    assert [e.key for e in twice.events(RUN)] == ["k1"]
    world.close(twice)


def test_a_nodes_place_on_the_ladder_is_one_record_kept_across_a_restart(world: StoreWorld, store: Store) -> None:
    drained = NodeCare("gpu-7", Rung.DRAINED, 10.0, "XID 79: GPU has fallen off the bus", "xid-79@1")
    store.keep_node_care(drained, 10.0)
    store.keep_node_care(drained, 10.0)  # again after a crash: still one record
    rebooting = replace(drained, rung=Rung.REBOOTING, since=20.0, boot_before=5.0, evidence={"boot_time": 5.0})
    store.keep_node_care(rebooting, 20.0)
    store.keep_node_care(NodeCare("gpu-1", Rung.PROBATION, 30.0, "XID 48", until=1e9, failures=1), 30.0)
    again = reopened(world, store)
    assert again.node_cares() == {
        "gpu-1": NodeCare("gpu-1", Rung.PROBATION, 30.0, "XID 48", until=1e9, failures=1),
        "gpu-7": rebooting,
    }
    again.drop_node_care("gpu-7")
    again.drop_node_care("gpu-7")  # gone already: no error
    assert list(again.node_cares()) == ["gpu-1"]
    world.close(again)


def test_each_store_has_its_own_instance_id(world: StoreWorld) -> None:
    other = world.elsewhere()
    a, b = world.open(), other.open()
    try:
        assert a.instance_id and b.instance_id and a.instance_id != b.instance_id
    finally:
        world.close(a)
        other.close(b)


# ---------------------------------------------------------------------------- the intent journal


def test_an_intent_is_open_from_begin_until_it_is_completed(store: Store) -> None:
    params = {"node": "n1", "change": "DOWN", "reason": "dead"}
    intent = store.begin_action(RUN, "node_state", params, 2.0)
    assert store.open_actions() == [Intent(intent, RUN, "node_state", params, 2.0)]
    assert store.action_done(RUN, "node_state", params) is False
    store.complete_action(intent, "done", {"ok": True}, 3.0)
    assert store.open_actions() == []
    assert store.action_done(RUN, "node_state", {"reason": "dead", "change": "DOWN", "node": "n1"})  # any key order


def test_a_failed_intent_is_closed_and_not_done(store: Store) -> None:
    intent = store.begin_action(RUN, "submit", {"nonce": "x"}, 2.0)
    store.complete_action(intent, "failed", {"error": "sbatch: error: invalid partition"}, 3.0)
    assert store.open_actions() == []
    assert store.action_done(RUN, "submit", {"nonce": "x"}) is False
    assert store.refused_submissions(RUN, 3.0) == [(3.0, "sbatch: error: invalid partition")]
    assert store.refused_submissions(RUN, 3.5) == []


def test_open_intents_come_oldest_first_with_growing_ids(store: Store) -> None:
    ids = [store.begin_action(RUN, "cancel", {"job_id": job}, 2.0 + job) for job in (1, 2, 3)]
    store.complete_action(ids[1], "done", {}, 6.0)
    assert ids == sorted(ids) and len(set(ids)) == 3
    assert [(i.id, i.params["job_id"]) for i in store.open_actions()] == [(ids[0], 1), (ids[2], 3)]


def test_an_open_intent_outlives_the_daemon(world: StoreWorld, store: Store) -> None:
    intent = store.begin_action(RUN, "submit", {"nonce": "x", "resume": {"step": 100}}, 2.0)
    [left] = reopened(world, store).open_actions()
    assert left == Intent(intent, RUN, "submit", {"nonce": "x", "resume": {"step": 100}}, 2.0)


def test_an_intent_begun_in_a_transaction_that_failed_was_never_open(store: Store) -> None:
    with pytest.raises(Boom), store.transaction():
        store.begin_action(RUN, "submit", {"nonce": "x"}, 2.0)
        raise Boom
    assert store.open_actions() == []


# ---------------------------------------------------------------------------- records read back whole


def test_what_the_engine_reads_back_comes_back_whole(store: Store) -> None:
    rich = spec(name="rich", nodes=4, spare_nodes=("n9",), max_restarts=5, sbatch_args=("--gpus-per-node=8",))
    store.add_run(rich, 1.0)
    assert store.get_run("rich").spec == rich
    store.add_attempt(RUN, 100, 0, 1.0)
    pace = HangPace(((60.0, 10), (61.5, 10)), (10, 10))
    store.attempt_progress(RUN, 0, 1234, 6.5, pace)
    attempt = store.get_run(RUN).attempt
    assert (attempt.last_step, attempt.step_time_s, attempt.hang_pace) == (1234, 6.5, pace)
    store.record_rollback(RollbackRecord(RUN, 0, 500, RollbackStatus.PLANNED, 4.0, "why", 400))
    store.record_rollback(RollbackRecord(RUN, 1, 900, RollbackStatus.BLOCKED, 5.0, "no checkpoint"))
    store.rollbacks_done(RUN, before_attempt=1)
    assert [r.status for r in store.rollbacks(RUN)] == [RollbackStatus.DONE, RollbackStatus.BLOCKED]
    finding = NodeFinding("n1", Severity.FATAL, "XID 79", "xid-79@1", 6.0, run=RUN, evidence={"gpu": 3})
    store.keep_findings([finding])
    assert store.active_findings() == {"n1": finding}
    store.keep_findings([])
    assert store.active_findings() == {}


# ---------------------------------------------------------------------------- the leader lease and its fence

A, B = "login1:100:aa", "login2:200:bb"


@pytest.fixture
def second(world: StoreWorld, store: Store) -> Iterator[Store]:
    """Another daemon's connection to the same store (a second login node)."""
    other = world.open()
    yield other
    world.close(other)


def test_the_first_claim_takes_the_lease_and_the_holder_renews_it_in_the_same_epoch(store: Store) -> None:
    assert store.lease() is None
    first = store.claim_lease(A, "http://login1:8080", 30.0)
    again = store.claim_lease(A, "http://login1:8080", 30.0)
    assert (first.holder, first.epoch, again.epoch, again.since) == (A, 1, 1, first.since)
    assert 29.0 < again.expires_in_s <= 30.0
    read = store.lease()
    assert read is not None and read == replace(again, expires_in_s=read.expires_in_s)


def test_a_valid_lease_is_left_to_its_holder_and_a_standby_is_told_who_leads(store: Store, second: Store) -> None:
    store.claim_lease(A, "http://login1:8080", 30.0)
    seen = second.claim_lease(B, "http://login2:8080", 30.0)
    assert (seen.holder, seen.address, seen.epoch) == (A, "http://login1:8080", 1)


def test_an_expired_lease_is_taken_with_the_next_epoch(store: Store, second: Store) -> None:
    store.claim_lease(A, "a", 0.05)
    deadline = time.monotonic() + 10.0
    while (taken := second.claim_lease(B, "b", 30.0)).holder != B:  # the database's clock decides
        assert time.monotonic() < deadline, "a lease of 0.05 s never expired"
        time.sleep(0.02)
    assert taken.epoch == 2
    assert store.claim_lease(A, "a", 30.0).holder == B  # the old holder is a standby now


def test_a_released_lease_is_taken_at_once_and_the_epoch_only_grows(store: Store, second: Store) -> None:
    store.claim_lease(A, "a", 30.0)
    store.release_lease(B)  # not B's: nothing changes
    assert second.claim_lease(B, "b", 30.0).holder == A
    store.release_lease(A)
    assert second.claim_lease(B, "b", 30.0).epoch == 2
    second.release_lease(B)
    assert store.claim_lease(A, "a", 30.0).epoch == 3


def _superseded(store: Store, second: Store) -> None:
    """``store`` led at epoch 1 and holds it; ``second`` took over at epoch 2."""
    store.hold_epoch(store.claim_lease(A, "a", 30.0).epoch)
    store.release_lease(A)
    second.hold_epoch(second.claim_lease(B, "b", 30.0).epoch)


def test_every_write_of_an_older_epoch_is_refused_and_leaves_nothing(store: Store, second: Store) -> None:
    intent = store.begin_action(RUN, "submit", {"nonce": "x"}, 1.5)
    cared = NodeCare("n2", Rung.DRAINED, 1.5, "XID 79")
    store.keep_node_care(cared, 1.5)
    _superseded(store, second)
    event = Event(RUN, EventKind.NOTE, "late", f"{RUN}:note:late", 2.0)
    refused: list[Callable[[], object]] = [
        lambda: store.begin_action(RUN, "submit", {"nonce": "y"}, 2.0),
        lambda: store.complete_action(intent, "done", {"job_id": 7}, 2.0),
        lambda: store.record_event(event),
        lambda: store.add_attempt(RUN, 300, 0, 2.0),
        lambda: store.set_state(RUN, RunState.QUEUED, 2.0),
        lambda: store.record_node_fault(Fault("n1", RUN, 2.0, "xid")),
        lambda: store.keep_node_care(NodeCare("n1", Rung.DRAINED, 2.0, "XID 79"), 2.0),
        lambda: store.drop_node_care("n2"),
    ]
    for write in refused:
        with pytest.raises(NotLeading):
            write()
    with pytest.raises(NotLeading), store.transaction():
        store.record_event(event)
    assert [i.id for i in second.open_actions()] == [intent]
    assert second.events(RUN) == [] and second.get_run(RUN).attempt is None
    assert second.node_faults(0.0) == [] and second.node_cares() == {"n2": cared}
    assert store.open_actions()[0].id == intent  # reads are never fenced


def test_the_leader_writes_and_its_intents_carry_its_epoch(store: Store, second: Store) -> None:
    _superseded(store, second)
    intent = second.begin_action(RUN, "submit", {"nonce": "z"}, 3.0)
    second.complete_action(intent, "done", {"job_id": 9}, 4.0)
    journal = getattr(second, "actions")(RUN)  # both stores' whole journal, for tests
    assert [(a["id"], a["status"], a["epoch"]) for a in journal] == [(intent, "done", 2)]


def test_a_connection_that_holds_no_epoch_is_never_refused(store: Store, second: Store) -> None:
    _superseded(store, second)
    store.hold_epoch(None)  # one daemon without a lease, or a tool
    assert store.record_event(Event(RUN, EventKind.NOTE, "tool", f"{RUN}:note:tool", 2.0)) is True
