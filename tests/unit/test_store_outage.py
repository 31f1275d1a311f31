"""The shared store unreachable (issue 33, item 5): nobody acts while it is away; when it answers
again the leader writes one ``store_outage`` entry per active run (since, until, the first error)
before anything else, and the metrics count it. An outage up to ``outage_logged_after_s`` is not
worth an entry: the boundary. The real PostgreSQL stopped for 60 s:
tests/postgres/test_failover_slurm.py.

The store's lease port is unreachable from ``down`` to ``up`` on the virtual clock (as a stopped
PostgreSQL answers every claim); the engine, its store and the simulated cluster are real."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.adapters.metrics import metrics_text
from supervisor.adapters.sqlite import SqliteStore
from supervisor.domain.lease import Lease
from supervisor.domain.records import EventKind
from supervisor.engine.loop.daemon import Pacing, run_loop
from supervisor.engine.loop.leadership import Leadership, LeaseSettings
from supervisor.ports import TransientError
from supervisor.sim.clock import VirtualClock
from supervisor.sim.slurm.cluster import SimCluster
from supervisor.testing.kit.engine import EngineHarness
from supervisor.testing.kit.specs import spec

SETTINGS = LeaseSettings(lease_s=15.0, margin_s=3.0, inflight_s=5.0, retry_s=1.0)
LOGGED_AFTER_S = 10.0  # EngineSettings.outage_logged_after_s's default


class StoppedStore:
    """The lease port of a store that does not answer from ``down`` to ``up`` (clock seconds)."""

    def __init__(self, inner: SqliteStore, clock: VirtualClock, down: float, up: float) -> None:
        self._inner, self._clock, self.down, self.up = inner, clock, down, up
        self.refused = 0

    def claim_lease(self, holder: str, address: str, lease_s: float) -> Lease:
        if self.down <= self._clock.now() < self.up:
            self.refused += 1
            raise TransientError("connection refused: is the server running?")
        return self._inner.claim_lease(holder, address, lease_s)

    def release_lease(self, holder: str) -> None:
        self._inner.release_lease(holder)

    def lease(self) -> Lease | None:
        return self._inner.lease()

    def hold_epoch(self, epoch: int | None) -> None:
        self._inner.hold_epoch(epoch)


@pytest.mark.parametrize(("outage_s", "entries"), [(60.0, 1), (LOGGED_AFTER_S - 1.0, 0)])
def test_nothing_is_done_while_the_store_is_away_and_the_logbook_says_so(
    tmp_path: Path, outage_s: float, entries: int
) -> None:
    clock = VirtualClock()
    cluster = SimCluster(clock, 4, "main")
    world = EngineHarness(tmp_path, clock=clock, scheduler=cluster, open_store=SqliteStore, specs=[spec(name="llm")])
    start = clock.now()
    down, up = start + 20.0, start + 20.0 + outage_s
    lease = StoppedStore(world.store, clock, down, up)
    lead = Leadership(
        lease, world.store, [world.store], holder="login1:1:00", address="a", settings=SETTINGS, monotonic=clock.now, wall=clock.now
    )  # fmt: skip

    def crash_the_runs_node() -> None:  # while the store is away: nobody may act on it
        [job] = cluster.snapshot().jobs.values()
        cluster.crash_node(job.nodes[0])

    clock.call_at(down + 1.0, crash_the_runs_node)
    calls_at: dict[str, int] = {}
    clock.call_at(up - 0.01, lambda: calls_at.update(submit=cluster.count_calls("submit")))
    run_loop(world.engine, Pacing(1.0), max_ticks=int(20 + outage_s + 40), leadership=lead)
    assert lease.refused >= outage_s - 1  # one claim a second (retry_s) while it was away
    assert calls_at["submit"] == 1  # the first submission only: nothing while it was away
    opened = [a["created_at"] for a in world.store.actions("llm")]
    assert not [t for t in opened if down <= t < up], opened
    assert cluster.count_calls("submit") == 2  # back: the recovery, once
    outages = world.store.events_of("llm", (EventKind.STORE_OUTAGE,))
    assert len(outages) == entries
    text = metrics_text(world.store, clock.now()).decode()
    assert f'slurm_supervisor_events_total{{kind="store_outage",run="llm"}} {float(entries)}' in text
    if entries:
        assert outages[0].evidence["since"] == pytest.approx(down, abs=1.5)
        assert outages[0].evidence["until"] == pytest.approx(up, abs=1.5)
        assert "did not answer for 60 s" in outages[0].message and "connection refused" in outages[0].message
        recovered = min(t for t in opened if t >= up)
        assert outages[0].at <= recovered  # written before the first action after it
