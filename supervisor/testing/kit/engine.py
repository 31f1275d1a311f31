"""``EngineHarness``: the engine, its store and its collaborators, put together once for tests.

In the spirit of ``structlog.testing``: the one place a test builds an ``Engine``. The harness holds
a state directory and the store opened on it (``open_store``: the tests give ``SqliteStore``), a
scheduler and a clock (the simulated cluster and its virtual clock in unit tests; any ``Scheduler``
and ``Clock`` will do), and the optional collaborators, as attributes a test may change before
``new_engine()``:

* ``probe``, ``fencer``, ``health``: given as they are;
* ``hang``: when set, a ``ProgressWatch`` following ``logs`` (a ``MemoryLogs`` opener);
* ``ckpt``: when set, a ``CheckpointWatch`` over that ``CheckpointStore``, working inline, writing
  resume files into ``files`` through ``write_resume``;
* ``crash_hook``: read at every action boundary of whichever engine is current (``crash_once``
  arms one that kills the daemon once, ``survive_crash`` restarts it as systemd would);
* ``stacks``: the StackCapture port a hang's stacks are taken through (None: none are);
* ``accounting``: the Accounting port (sacct) the next engine reads forgotten jobs from (None: a
  cluster without slurmdbd).

This module sits in the ``testing`` layer (pyproject's import-linter contract), beside the adapters
and below the simulator, so it imports neither: the concrete store, cluster and checkpoint storage
are handed in (``tests/unit/sim_world.py`` does that for the simulated cluster).

``new_engine()`` is what a restarted daemon does: a new store connection on the same directory and
new collaborators with no memory. ``tick()`` runs the ``before_tick`` callbacks, one engine tick,
then lets ``interval`` seconds pass on the clock; ``until(predicate)`` ticks until it holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Generic, TypeVar

from supervisor.domain.cluster import ClusterSnapshot, JobInfo
from supervisor.domain.progress.hang import HangSettings
from supervisor.domain.records import Event, EventKind, RunRecord
from supervisor.domain.run import RunSpec, RunState
from supervisor.engine.facts.hang_stacks import HangStacks
from supervisor.engine.reconcile import CrashHook, Engine, EngineSettings, TickResult
from supervisor.engine.watch.checkpoints import CheckpointWatch
from supervisor.engine.watch.progress import ProgressWatch
from supervisor.ports import (
    Accounting,
    CheckpointStore,
    Clock,
    Fencer,
    HealthFeed,
    NodeGuard,
    NodeProbe,
    Scheduler,
    StackCapture,
    Store,
)
from supervisor.testing.kit.logs import MemoryLogs

S = TypeVar("S", bound=Scheduler)


class DaemonCrash(BaseException):
    """The daemon process dying at an action boundary (BaseException: nothing may catch it)."""


class EngineHarness(Generic[S]):
    def __init__(
        self,
        state_dir: str | Path,
        *,
        clock: Clock,
        scheduler: S,
        open_store: Callable[[Path], Store],
        specs: Iterable[RunSpec] = (),
        settings: EngineSettings = EngineSettings(),
        probe: NodeProbe | None = None,
        fencer: Fencer | None = None,
        health: HealthFeed | None = None,
        hang: HangSettings | None = None,
        ckpt: CheckpointStore | None = None,
        view: Callable[[], ClusterSnapshot] | None = None,
        interval: float = 1.0,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.clock = clock
        self.scheduler = scheduler
        self.settings = settings
        self.probe = probe
        self.fencer = fencer
        self.health = health
        self.hang = hang
        self.ckpt = ckpt
        self.crash_hook: CrashHook | None = None
        self.guard: NodeGuard | None = None  # the node guard, when a test sets one before new_engine()
        self.accounting: Accounting | None = None  # sacct for jobs squeue forgot; None: no slurmdbd
        self.stacks: StackCapture | None = None  # a hang's stacks before the cancel (issue 35); None: none taken
        self.interval = interval
        self.view = view or scheduler.snapshot  # what job() reads: give a side-effect-free one if there is
        self.logs = MemoryLogs()
        self.files: dict[str, str] = {}  # resume files written: path -> JSON text
        self.write_resume: Callable[[str, str], None] = self.files.__setitem__
        self.before_tick: list[Callable[[], None]] = []
        self.open_store = open_store
        self.store = open_store(self.state_dir)
        specs = tuple(specs)
        self.default_run = specs[0].name if specs else ""
        for spec in specs:
            self.store.add_run(spec, clock.now())
        self.engine = self.new_engine()

    # ------------------------------------------------------------------ the engine's life

    def new_engine(self) -> Engine:
        """The daemon (re)started on the same state directory: a new store connection, new
        collaborators with no memory. Becomes ``self.engine``."""
        self.store = self.open_store(self.state_dir)
        progress = ProgressWatch(self.logs, self.hang) if self.hang is not None else None
        checkpoints = None
        if self.ckpt is not None:
            ckpt = self.ckpt
            checkpoints = CheckpointWatch(
                lambda spec: ckpt,
                self.clock,
                inline=True,
                write_resume=lambda path, text: self.write_resume(path, text),
            )
        self.engine = Engine(
            scheduler=self.scheduler,
            store=self.store,
            clock=self.clock,
            settings=self.settings,
            probe=self.probe,
            fencer=self.fencer,
            crash_hook=self._crash,
            progress=progress,
            checkpoints=checkpoints,
            accounting=self.accounting,
            health=self.health,
            guard=self.guard,
            stacks=HangStacks(self.stacks, None, self.clock) if self.stacks is not None else None,
        )
        return self.engine

    def _crash(self, boundary: str, kind: str) -> None:
        if self.crash_hook is not None:
            self.crash_hook(boundary, kind)

    def crash_once(self, boundary: str, kind: str) -> list[tuple[str, str]]:
        """The daemon dies (``DaemonCrash``) the first time it reaches ``boundary`` for an action of
        ``kind``; returns the list that crash is recorded in."""
        fired: list[tuple[str, str]] = []

        def hook(at: str, action: str) -> None:
            if at == boundary and action == kind and not fired:
                fired.append((at, action))
                raise DaemonCrash(at)

        self.crash_hook = hook
        return fired

    def survive_crash(self, step: Callable[[], object]) -> None:
        """``step()``; when the daemon dies in it, it starts again on the same store (hook disarmed,
        its runs adopted) and ``step()`` runs again."""
        try:
            step()
        except DaemonCrash:
            self.crash_hook = None
            self.new_engine()
            self.engine.adopt()
            step()

    # ------------------------------------------------------------------ time

    def tick(self, interval: float | None = None) -> TickResult:
        """The ``before_tick`` callbacks, one engine tick, then ``interval`` seconds pass."""
        for callback in self.before_tick:
            callback()
        result = self.engine.tick()
        self.clock.wait(self.interval if interval is None else interval)
        return result

    def ticks(self, n: int, interval: float | None = None) -> None:
        for _ in range(n):
            self.tick(interval)

    def until(self, predicate: Callable[[], object], limit: int = 300, interval: float | None = None) -> float:
        """Tick until ``predicate()`` holds (checked before each tick); the clock seconds it took.
        AssertionError after ``limit`` ticks."""
        start = self.clock.now()
        for _ in range(limit):
            if predicate():
                return self.clock.now() - start
            self.tick(interval)
        raise AssertionError(f"condition not reached in {limit} ticks")

    # ------------------------------------------------------------------ what there is to see

    def run(self, name: str | None = None) -> RunRecord:
        record = self.store.get_run(name or self.default_run)
        assert record is not None, f"no run {name or self.default_run!r}"
        return record

    def running(self, seq: int | None = None, name: str | None = None) -> bool:
        """The run is RUNNING with its attempt started (attempt ``seq``, when given)."""
        r = self.run(name)
        return (
            r.state is RunState.RUNNING
            and r.attempt is not None
            and r.attempt.started_at is not None
            and (seq is None or r.attempt.seq == seq)
        )

    def job(self, name: str | None = None) -> JobInfo:
        """The Slurm job of the run's current attempt."""
        attempt = self.run(name).attempt
        assert attempt is not None
        return self.view().jobs[attempt.job_id]

    def events(self, kind: EventKind | None = None, name: str | None = None) -> list[Event]:
        """The run's logbook events, of ``kind`` only when given."""
        return [e for e in self.store.events(name or self.default_run) if kind is None or e.kind is kind]
