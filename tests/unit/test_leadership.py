"""One leader per instance (issue 33, ``engine.loop.leadership``): two daemons' connections to one
store (SQLite here; PostgreSQL in tests/postgres/test_failover.py), a manual monotonic clock for
the self-fencing deadline (the lease itself is on the database's clock)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.adapters.sqlite import SqliteStore
from supervisor.domain.cluster import NodeChange, SubmitRequest
from supervisor.domain.records import Event, EventKind
from supervisor.engine.loop.leadership import (
    GatedFencer,
    GatedGuard,
    GatedScheduler,
    Leadership,
    LeaseSettings,
    LostLead,
    Role,
)
from supervisor.ports import Fencer, NodeGuard, NotLeading, Scheduler
from supervisor.sim.clock import VirtualClock
from supervisor.sim.slurm.cluster import SimCluster
from supervisor.testing.kit.clock import ManualClock
from supervisor.testing.kit.specs import spec

SETTINGS = LeaseSettings(lease_s=30.0, margin_s=6.0, inflight_s=20.0)


class Daemon:
    """One login node's daemon: its store connection, its leadership, its monotonic clock."""

    def __init__(self, state_dir: Path, name: str, wall: ManualClock) -> None:
        self.store = SqliteStore(state_dir)
        self.mono = ManualClock(0.0)
        self.lead = Leadership(
            self.store,
            self.store,
            [self.store],
            holder=f"{name}:1:00",
            address=f"http://{name}:8080",
            settings=SETTINGS,
            monotonic=self.mono.now,
            wall=wall.now,
        )


@pytest.fixture
def wall() -> ManualClock:
    return ManualClock()


@pytest.fixture
def pair(tmp_path: Path, wall: ManualClock) -> Iterator[tuple[Daemon, Daemon]]:
    first, second = Daemon(tmp_path, "login1", wall), Daemon(tmp_path, "login2", wall)
    first.store.add_run(spec(name="llm"), wall.now())
    yield first, second
    first.store.close()
    second.store.close()


def _note(key: str) -> Event:
    return Event("llm", EventKind.NOTE, key, f"llm:note:{key}", 1.0)


def test_one_of_two_daemons_leads_and_only_it_may_act(pair: tuple[Daemon, Daemon]) -> None:
    one, two = pair
    led, stood = one.lead.claim(), two.lead.claim()
    assert (led.role, led.gained, stood.role) == (Role.LEADER, True, Role.STANDBY)
    assert "login1:1:00 leads at http://login1:8080 (epoch 1)" in stood.line()
    one.lead.may_act()
    with pytest.raises(NotLeading):
        two.lead.may_act()
    with pytest.raises(NotLeading):  # a standby's connections cannot change the store either
        two.store.record_event(_note("standby"))
    assert one.store.record_event(_note("leader")) is True
    assert one.lead.claim().gained is False  # renewed: the same epoch, nothing to re-adopt


def test_a_leader_that_cannot_renew_stops_acting_before_its_lease_can_end(pair: tuple[Daemon, Daemon]) -> None:
    one, _ = pair
    one.lead.claim()
    one.mono.advance(SETTINGS.lease_s - SETTINGS.margin_s - 0.1)
    one.lead.may_act()
    one.mono.advance(0.2)  # no renewal since: the lease may end soon on the database's clock
    with pytest.raises(NotLeading, match="not renewed in time"):
        one.lead.may_act()
    one.lead.claim()  # renewed (nobody took it): acting again
    one.lead.may_act()


def test_a_standby_takes_a_released_lease_and_the_old_leader_can_change_nothing(
    pair: tuple[Daemon, Daemon],
) -> None:
    one, two = pair
    one.lead.claim()
    one.store.release_lease(one.lead.holder)  # as if it expired: the old leader does not know yet
    taken = two.lead.claim()
    assert (taken.role, taken.gained, taken.lease and taken.lease.epoch) == (Role.LEADER, True, 2)
    with pytest.raises(NotLeading):
        one.store.begin_action("llm", "submit", {"nonce": "late"}, 2.0)
    assert two.store.open_actions() == []
    with pytest.raises(LostLead, match="login2:1:00 took the lease"):
        one.lead.claim()
    with pytest.raises(NotLeading):
        one.lead.may_act()


def test_a_new_leader_waits_for_an_action_the_old_one_may_still_have_in_flight(
    pair: tuple[Daemon, Daemon], wall: ManualClock
) -> None:
    one, two = pair
    one.store.hold_epoch(one.lead.claim().lease.epoch)  # type: ignore[union-attr]
    one.store.begin_action("llm", "submit", {"nonce": "n"}, wall.now())
    one.store.release_lease(one.lead.holder)
    wall.advance(5.0)
    taken = two.lead.claim()
    assert taken.leading and taken.wait_s == pytest.approx(SETTINGS.inflight_s + 1.0 - 5.0)
    two.mono.advance(taken.wait_s)
    assert two.lead.claim().wait_s == 0.0


def test_commands_that_change_slurm_wait_for_the_lead_and_reads_pass(pair: tuple[Daemon, Daemon]) -> None:
    one, two = pair
    cluster = SimCluster(VirtualClock(), 2, "main")
    one.lead.claim()
    two.lead.claim()
    gated = GatedScheduler(cluster, two.lead.may_act)
    assert len(gated.snapshot().nodes) == 2
    with pytest.raises(NotLeading):
        gated.submit(SubmitRequest("llm", "#!/bin/sh\n", "llm", "main", 1, "tag"))
    with pytest.raises(NotLeading):
        gated.set_node_state("n001", NodeChange.DRAIN, "why")
    assert not cluster.snapshot().jobs  # nothing reached the cluster


@pytest.mark.parametrize(
    ("port", "gate", "reads"),
    [(Scheduler, GatedScheduler, {"snapshot"}), (NodeGuard, GatedGuard, {"quarantined"}), (Fencer, GatedFencer, set())],
)
def test_every_command_of_a_port_is_gated_not_passed_through(port: type, gate: type, reads: set[str]) -> None:
    """GatedScheduler passes unknown attributes through (reads, extras): a command added to a port
    must be decided on here, or a standby could send it to Slurm ungated."""
    commands = {name for name in vars(port) if not name.startswith("_") and callable(getattr(port, name))}
    assert commands - reads, port
    assert commands - reads <= set(vars(gate)), sorted(commands - reads - set(vars(gate)))


def test_only_the_leader_ticks_and_a_clean_stop_hands_the_runs_to_the_standby(tmp_path: Path) -> None:
    from supervisor.engine.loop.daemon import Pacing, run_loop
    from supervisor.testing.kit.engine import EngineHarness

    clock = VirtualClock()
    cluster = SimCluster(clock, 4, "main")
    worlds = [
        EngineHarness(tmp_path, clock=clock, scheduler=cluster, open_store=SqliteStore, specs=specs)
        for specs in ((spec(name="llm"),), ())
    ]
    leads = [
        Leadership(w.store, w.store, [w.store], holder=f"login{i}:1:00", address="a", settings=SETTINGS)
        for i, w in enumerate(worlds)
    ]
    leads[0].claim()
    assert run_loop(worlds[1].engine, Pacing(1.0), max_ticks=3, leadership=leads[1]) == 0  # a standby
    assert cluster.snapshot().jobs == {}
    assert run_loop(worlds[0].engine, Pacing(1.0), max_ticks=2, leadership=leads[0]) == 2  # ... stops, releasing
    submitted = set(cluster.snapshot().jobs)
    assert len(submitted) == 1
    assert run_loop(worlds[1].engine, Pacing(1.0), max_ticks=2, leadership=leads[1]) == 2
    assert set(cluster.snapshot().jobs) == submitted  # the run was followed on, not submitted again
    adopted = [e.message for e in worlds[1].store.events("llm") if e.kind is EventKind.ADOPTED]
    assert adopted == [
        "daemon re-adopted the run (registered, no job yet)",
        "daemon re-adopted the run (running, job 1000)",
    ]
