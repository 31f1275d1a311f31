"""The node-care keeper (engine/act/care.py) on a real SQLite store: every rung through the
hands, the journal keeping a killed daemon from rebooting twice, needs repair paging once."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from supervisor.adapters.sqlite.store import SqliteStore
from supervisor.domain.health.ladder import CareOp, LadderSettings, NodeSeen, Rung, enter
from supervisor.domain.health.validation import ValidationFigures, ValidationVerdict
from supervisor.domain.records import EventKind
from supervisor.engine.act.care import KIND, NodeCareKeeper, journal_run
from supervisor.ports import PermanentError
from supervisor.testing.kit.clock import ManualClock

NODE = "n7"


@dataclass
class Hands:
    """A node that reboots when asked (its boot time moves on) and a validation that reports."""

    in_service: bool = False
    boot_time: float = 100.0
    verdicts: list[bool] = field(default_factory=list)
    done: list[CareOp] = field(default_factory=list)
    die_on: CareOp | None = None  # raise after performing: a daemon killed between intent and completion

    def seen(self, node: str) -> NodeSeen:
        return NodeSeen(node, self.in_service, self.boot_time)

    def verdict(self, node: str) -> ValidationVerdict | None:
        if not self.verdicts:
            return None
        passed = self.verdicts.pop(0)
        return ValidationVerdict(passed, () if passed else ("burn too slow",), ValidationFigures(node, burn=1.0))

    def remedy(self, op: CareOp, node: str, why: str) -> None:
        self.done.append(op)
        if op is self.die_on:  # the reboot was asked; the node is still going down when the daemon dies
            self.die_on = None
            raise KeyboardInterrupt("killed")
        if op is CareOp.REBOOT:
            self.in_service, self.boot_time = True, self.boot_time + 1000.0
        if op is CareOp.DRAIN:
            self.in_service = False


@pytest.fixture
def world(tmp_path):
    store = SqliteStore(tmp_path)
    clock = ManualClock()
    hands = Hands()
    store.keep_node_care(enter(NODE, "XID 79: fell off the bus", "xid-79@1", clock.now()).care, clock.now())
    return store, clock, hands, NodeCareKeeper(store=store, hands=hands, clock=clock, settings=LadderSettings())


def rung(store: SqliteStore) -> str:
    care = store.node_cares().get(NODE)
    return care.rung if care else "healthy"


def ticks(keeper: NodeCareKeeper, clock: ManualClock, n: int) -> None:
    for _ in range(n):
        keeper.tick()
        clock.advance(5.0)


def test_every_rung_to_probation_with_logbook_lines(world) -> None:
    store, clock, hands, keeper = world
    seen = []
    for _ in range(4):
        keeper.tick()
        seen.append(rung(store))
        hands.verdicts = [True] if rung(store) == Rung.VALIDATING else []
        clock.advance(5.0)
    assert seen == [Rung.RESERVED, Rung.REBOOTING, Rung.VALIDATING, Rung.PROBATION]
    assert hands.done == [CareOp.RESERVE, CareOp.REBOOT, CareOp.VALIDATE, CareOp.RESUME]
    lines = [e for e in store.events(journal_run(NODE)) if e.kind is EventKind.NODE_CARE]
    assert [e.message.split(" ")[0] for e in lines][-1] == "validation"
    assert lines[-1].evidence["burn"] == 1.0
    assert keeper.kept_out(run_nodes=4) == frozenset() and keeper.kept_out(run_nodes=64) == {NODE}


def failing_every_validation(store, clock, hands, keeper) -> None:
    """Tick until the node needs repair, each of its validations failing."""
    for _ in range(12):
        if rung(store) == Rung.VALIDATING:
            hands.verdicts = [False]
        keeper.tick()
        clock.advance(5.0)
    assert rung(store) == Rung.NEEDS_REPAIR


def test_failing_twice_needs_repair_pages_once_and_stays_out(world) -> None:
    store, clock, hands, keeper = world
    failing_every_validation(store, clock, hands, keeper)
    assert hands.done.count(CareOp.PAGE) == 1
    assert hands.done.count(CareOp.REBOOT) == 2
    assert keeper.kept_out(run_nodes=1) == {NODE}


def test_killed_between_intent_and_completion_does_not_reboot_twice(world) -> None:
    store, clock, hands, keeper = world
    keeper.tick()  # reserved
    hands.die_on = CareOp.REBOOT
    with pytest.raises(KeyboardInterrupt):
        keeper.tick()
    assert [i.kind for i in store.open_actions()] == [KIND]
    restarted = NodeCareKeeper(store=store, hands=hands, clock=clock, settings=LadderSettings())
    ticks(restarted, clock, 1)  # the node is still down: the reboot asked before the kill counts
    assert rung(store) == Rung.REBOOTING
    hands.in_service, hands.boot_time = True, hands.boot_time + 1000.0  # back with a new boot time
    ticks(restarted, clock, 2)
    assert hands.done.count(CareOp.REBOOT) == 1
    assert rung(store) == Rung.VALIDATING
    assert store.open_actions() == []


def test_a_refused_remedy_leaves_the_record_where_it_stood(world) -> None:
    store, clock, hands, keeper = world

    def refuse(op: CareOp, node: str, why: str) -> None:
        raise PermanentError("not your node")

    hands.remedy = refuse  # type: ignore[method-assign]
    keeper.tick()
    assert rung(store) == Rung.DRAINED


def test_a_node_a_person_returned_is_validated_before_use(world) -> None:
    store, clock, hands, keeper = world
    failing_every_validation(store, clock, hands, keeper)
    hands.in_service = True  # a person: scontrol update state=resume
    keeper.tick()
    assert rung(store) == Rung.RESERVED
    assert keeper.kept_out(run_nodes=1) == {NODE}
