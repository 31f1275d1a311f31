"""The real engine on the simulated cluster with its memory in PostgreSQL: a node crash recovered,
and the daemon killed at every action boundary of that recovery — one drain, one restart, the same
logbook as on SQLite (``tests/unit/test_engine_sim.py`` runs the same on SQLite alone)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.adapters.postgres import PostgresStore
from supervisor.adapters.sqlite import SqliteStore
from supervisor.domain.cluster import NodeChange
from supervisor.domain.records import EventKind
from supervisor.domain.run import SparePolicy
from supervisor.ports import Store
from supervisor.sim.clock import VirtualClock
from supervisor.sim.slurm.cluster import SimCluster
from supervisor.sim.slurm.probe import SimProbe
from supervisor.testing.kit.engine import EngineHarness
from supervisor.testing.kit.specs import spec

pytestmark = pytest.mark.postgres

SPEC = spec(spare_policy=SparePolicy.NAMED, spare_nodes=("n004",), max_restarts=5)


class World(EngineHarness[SimCluster]):
    def __init__(self, state_dir: Path, open_store: Callable[[Path], Store]) -> None:
        clock = VirtualClock()
        self.cluster = SimCluster(clock, 4, "main")
        super().__init__(
            state_dir,
            clock=clock,
            scheduler=self.cluster,
            open_store=open_store,
            specs=(SPEC,),
            probe=SimProbe(self.cluster),
            view=self.cluster.inspect,
        )


def _recover(world: World, boundary: str | None = None, kind: str | None = None) -> list[tuple[str, str]]:
    world.until(world.running)
    world.new_engine()
    fired = world.crash_once(boundary, kind) if boundary and kind else []
    world.cluster.crash_node("n001")
    world.survive_crash(lambda: world.until(lambda: world.running() and world.run().attempt.seq == 1))
    world.ticks(5)
    return fired


def _keys(store: Store) -> list[str]:
    return sorted(e.key for e in store.events() if e.kind is not EventKind.ADOPTED)


@pytest.fixture
def on_postgres(postgres, tmp_path):
    def opener(_: Path) -> Store:
        return PostgresStore(postgres.url, password=postgres.password)

    return World(tmp_path / "pg", opener)


def test_a_node_crash_is_recovered_with_the_store_in_postgres(on_postgres, tmp_path):
    sqlite = World(tmp_path / "sqlite", SqliteStore)
    _recover(sqlite)
    _recover(on_postgres)
    assert on_postgres.cluster.count_calls("submit") == 2
    assert on_postgres.run().excluded.keys() == {"n001"} and on_postgres.run().restarts_spent == 1
    assert _keys(on_postgres.store) == _keys(sqlite.store)  # the same logbook, event for event
    assert on_postgres.store.open_actions() == []


@pytest.mark.parametrize("kind", ["node_state", "cancel", "submit"])
@pytest.mark.parametrize("boundary", ["before_intent", "after_intent", "after_execute", "after_complete"])
def test_a_daemon_killed_at_any_action_boundary_acts_once(postgres, tmp_path, boundary, kind):
    url = postgres.new()
    world = World(tmp_path, lambda _: PostgresStore(url, password=postgres.password))
    fired = _recover(world, boundary, kind)
    assert fired == [(boundary, kind)]
    assert world.cluster.count_calls("submit") == 2  # the first job and exactly one restart
    assert [c[2] for c in world.cluster.calls if c[0] == "set_node_state"] == [NodeChange.DOWN, NodeChange.DRAIN]
    assert world.cluster.count_calls("cancel") <= 1
    assert world.run().restarts_spent == 1 and world.store.open_actions() == []
