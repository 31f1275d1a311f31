"""The newcomer's demo: the real engine and store supervising a run on a simulated cluster.

A 16-node run with 2 named spares on a 20-node partition; node crashes are injected at seeded
random times on nodes the run is using; the daemon loop (the same ``run_loop`` systemd runs)
detects each crash by its direct probe, downs the node with a reason, restarts the run without it,
and writes the logbook, which is printed at the end.
"""

from __future__ import annotations

import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from supervisor.adapters.sqlite import SqliteStore
from supervisor.domain.records import Event, EventKind, NodeVerdict, RunRecord
from supervisor.domain.run import RunSpec, SparePolicy
from supervisor.engine.act.register import register_run
from supervisor.engine.loop.daemon import Pacing, run_loop
from supervisor.engine.reconcile import Engine, EngineSettings
from supervisor.sim.clock import VirtualClock
from supervisor.sim.slurm.cluster import SimCluster
from supervisor.sim.slurm.probe import SimProbe

RUN = "llama-demo"


@dataclass(frozen=True)
class DemoSettings:
    total_nodes: int = 20
    run_nodes: int = 16
    spares: int = 2
    hours: float = 24.0
    crashes: int = 3
    seed: int = 7
    poll_interval_s: float = 5.0


def build(settings: DemoSettings, state_dir: Path) -> tuple[VirtualClock, SimCluster, SqliteStore, Engine]:
    if settings.run_nodes + settings.spares > settings.total_nodes:
        raise ValueError("the run and its spares need more nodes than the simulated partition has")
    clock = VirtualClock()
    cluster = SimCluster(clock, settings.total_nodes, "gpu")
    names = cluster.node_names
    spec = RunSpec(
        name=RUN,
        script="/shared/llama/train.sbatch",
        partition="gpu",
        nodes=settings.run_nodes,
        sbatch_args=("--gpus-per-node=8", "--time=14-00:00:00"),
        spare_policy=SparePolicy.NAMED,
        spare_nodes=tuple(names[len(names) - settings.spares :]),
        max_restarts=10,
    )
    store = SqliteStore(state_dir)
    now = clock.now()
    register_run(
        store,
        spec,
        now,
        actor="demo",
        message=f"run registered: {spec.nodes} nodes on gpu, spares {','.join(spec.spare_nodes)}",
    )
    engine = Engine(
        scheduler=cluster,
        store=store,
        clock=clock,
        settings=EngineSettings(probe_confirm_s=1.0),
        probe=SimProbe(cluster),
    )
    return clock, cluster, store, engine


def inject_crashes(settings: DemoSettings, clock: VirtualClock, cluster: SimCluster, store: SqliteStore) -> list[str]:
    rng = random.Random(settings.seed)
    span = settings.hours * 3600.0
    times = sorted(rng.uniform(0.1 * span, 0.9 * span) for _ in range(settings.crashes))
    injected: list[str] = []

    def crash() -> None:
        run = store.get_run(RUN)
        job = cluster.inspect().jobs.get(run.attempt.job_id) if run and run.attempt else None
        if job is None or not job.nodes:
            return
        node = rng.choice(sorted(job.nodes))
        injected.append(node)
        cluster.crash_node(node)

    for t in times:
        clock.call_at(clock.now() + t, crash)
    return injected


@dataclass(frozen=True)
class DemoOutcome:
    settings: DemoSettings
    run: RunRecord
    events: list[Event]
    verdicts: list[NodeVerdict]
    injected: list[str]
    ticks: int
    wall_s: float
    overlaps: int

    @property
    def recoveries(self) -> int:
        return sum(1 for e in self.events if e.kind is EventKind.RESTARTED)


def run_demo(settings: DemoSettings, state_dir: str | None = None) -> DemoOutcome:
    with tempfile.TemporaryDirectory(prefix="ssv-demo-") as tmp:
        started = time.perf_counter()
        clock, cluster, store, engine = build(settings, Path(state_dir or tmp))
        injected = inject_crashes(settings, clock, cluster, store)
        clock.call_at(clock.now() + settings.hours * 3600.0, clock.stop)
        ticks = run_loop(engine, Pacing(settings.poll_interval_s))
        run = store.get_run(RUN)
        assert run is not None
        outcome = DemoOutcome(
            settings,
            run,
            store.events(RUN),
            store.verdicts(),
            injected,
            ticks,
            time.perf_counter() - started,
            len(cluster.overlapping_incarnations()),
        )
        store.close()
        return outcome
