"""One simulation: the real engine (supervisor mode) or plain Slurm (baseline) over a ``World``.

Time is event-driven. The engine's loop is the daemon's (``run_loop``'s pacing: a tick every
``poll_interval_s`` when quiet, back-to-back ticks while acting, urgent ticks during a recovery),
but a quiet tick that could see nothing new is skipped: the loop jumps to the first tick of the
same poll grid at or after the next moment something could be seen —

* the next event on the virtual clock (a failure, a repair, a health check, a job start or end),
* the engine's own next deadline (``Engine.next_deadline``: a hang threshold running out),
* the first log lines of each attempt (the hang detector learns the step pace from them, so they
  are read on the real grid) and the last line before a drawn hang (so the silence is measured
  from when a real daemon would have read it),
* at most ``max_skip_s`` later.

So detection latency is the real one: a failure at t is seen at the first grid tick after t.
The baseline has no daemon: only the cluster's own events run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from supervisor.adapters.sqlite import SqliteStore
from supervisor.domain.cluster import SubmitRequest
from supervisor.domain.progress.hang import HangSettings
from supervisor.domain.progress.outputs import output_path
from supervisor.domain.run import CheckpointPolicy, ContinuationPolicy, RestartMode, RunSpec, SparePolicy
from supervisor.engine.act.register import register_run
from supervisor.engine.loop.tick_delay import Pacing, PacingState, next_delay
from supervisor.engine.reconcile import Engine, EngineSettings
from supervisor.engine.watch.checkpoints import CheckpointWatch
from supervisor.engine.watch.progress import ProgressWatch
from supervisor.sim.clock import VirtualClock
from supervisor.sim.faults.failures import Failure
from supervisor.sim.slurm.probe import SimProbe
from supervisor.sim.training.chain import chain_report
from supervisor.sim.training.results import SimResult, loss_breakdown, mark_recoveries
from supervisor.sim.training.settings import Mode, SimSettings
from supervisor.sim.training.survivors import daemon_grace_s
from supervisor.sim.training.world import World

RUN = "llama3-405b"
RESUME_FILE = "/sim/resume.json"  # a pre-queued job reads its checkpoint there (World.resume_files)
Progress = Callable[[float], None]  # fraction of simulated time done


def open_sim_store(state_dir: Path) -> SqliteStore:
    """The daemon's store (the logbook) on ``state_dir``, its commits not synced to disk: a
    simulated run can be run again, and a sync per commit (tens of thousands in a 54-day run) cost
    it up to a minute of wall time."""
    return SqliteStore(state_dir, durable=False)


def checkpoint_policy(settings: SimSettings, root: str) -> CheckpointPolicy:
    """The run spec's ``[checkpoints]``: the simulated store's root, scanned every 10 minutes, and
    for a trainer that saves on failure the daemon's grace for it (``survivors.daemon_grace_s``)."""
    return CheckpointPolicy(
        root=root,
        full_verify=False,
        scan_interval_s=600.0,
        save_on_failure_s=daemon_grace_s(settings),
        resume_file=RESUME_FILE if settings.chain.max_job_s is not None else None,
    )


def continuation_policy(settings: SimSettings) -> ContinuationPolicy | None:
    """The run spec's ``[continuation]`` on a partition with a time limit (sim.training.chain): the signal
    ``lead_s`` before the limit, the continue code, the next job pre-queued ``prequeue_s`` ahead."""
    chain = settings.chain
    if chain.max_job_s is None:
        return None
    return ContinuationPolicy(lead_s=chain.lead_s, prequeue_s=chain.prequeue_s, time_limit_s=int(chain.max_job_s))


@dataclass
class Simulation:
    settings: SimSettings
    mode: Mode
    state_dir: Path | None = None  # supervisor mode: where the SQLite store (the logbook) goes
    on_progress: Progress | None = None
    run_name: str = RUN
    open_store: Callable[[Path], SqliteStore] = open_sim_store  # the daemon's store on ``state_dir``
    world: World | None = field(default=None, init=False, repr=False)  # the last run's, for its ground truth

    def run(self, failures: list[Failure] | None = None) -> SimResult:
        started = time.process_time()
        s = self.settings
        draw = failures if failures is not None else s.failures.draw(s.seed, s.gpus, s.seconds)
        clock = VirtualClock()
        spec = self._spec(clock)
        world = self.world = World(s, self.mode, clock, path_of=lambda job_id: output_path(spec, job_id))
        world.schedule(draw)
        end = clock.now() + s.seconds
        ticks = 0
        store = None
        if self.mode.supervised:
            if self.state_dir is None:
                raise ValueError("supervisor mode needs a state directory for its store (the logbook)")
            store = self.open_store(self.state_dir)
            ticks = self._supervise(world, store, spec, end)
        else:
            self._baseline(world, spec, end)
        wall = clock.now() - world.start
        mark_recoveries(world.strikes, world.attempts(), clock.now())
        result = SimResult(
            s,
            self.mode,
            wall,
            world.kept_steps(),
            world.strikes,
            len(world.attempts()),
            world.torn_restarts,
            world.crash_restarts,
            ticks,
            time.process_time() - started,
            str(self.state_dir) if store is not None else None,
            self.run_name,
            {
                "health_findings": len(world.health.emitted),
                "step_attempts": [a.key for a in world.attempts()],
                "loss_s": loss_breakdown(world.strikes, world.attempts(), s.trainer.step_s),
                "survivor_saves": len(world.survivor_saves),
                "survivor_saves_torn": world.survivor_saves_torn(),
                "memory_restores": world.trainer.peers.restored,  # relaunches restored from peer copies
                **({"chain": chain_report(world.limits.log)} if s.chain.max_job_s or s.chain.preempt_per_day else {}),
            },
        )
        if store is not None:
            store.close()
        return result

    def _spec(self, clock: VirtualClock) -> RunSpec:
        s = self.settings
        names = [f"n{i:0{max(3, len(str(s.pool(self.mode))))}d}" for i in range(1, s.pool(self.mode) + 1)]
        spares = tuple(names[s.nodes_per_job :]) if self.mode is Mode.SUPERVISOR else ()
        spec = RunSpec(
            name=self.run_name,
            script="/sim/train.sbatch",
            partition="gpu",
            nodes=s.nodes_per_job,
            sbatch_args=(f"--gpus-per-node={s.gpus_per_node}",),
            output="/sim/logs/%x-%j.out",
            spare_policy=SparePolicy.NAMED if spares else SparePolicy.PARTITION_IDLE,
            spare_nodes=spares,
            max_restarts=1_000_000,
            continuation=continuation_policy(s),
        )
        if self.mode is Mode.IN_ALLOCATION:  # the job holds nodes + hot_spares; the rest idle
            return replace(spec, restart_mode=RestartMode.IN_ALLOCATION, hot_spares=s.hot_spares)
        return spec

    # -- baseline: Slurm alone ------------------------------------------------------------------

    def _baseline(self, world: World, spec: RunSpec, end: float) -> None:
        request = SubmitRequest(
            run=spec.name,
            script=spec.script,
            job_name=spec.name,
            partition=spec.partition,
            nodes=spec.nodes,
            comment="baseline",
            extra_args=_handmade_signal(self.settings) + spec.sbatch_args,
            output=spec.output,
            requeue=True,
        )
        world.cluster.submit(request)
        clock = world.clock
        step = max(3600.0, (end - clock.now()) / 200)
        while clock.now() < end:
            clock.advance_to(min(end, clock.now() + step))
            self._report(clock.now(), world.start, end)

    # -- supervisor: the real engine ------------------------------------------------------------

    def _supervise(self, world: World, store: SqliteStore, spec: RunSpec, end: float) -> int:
        s = self.settings
        clock = world.clock
        now = clock.now()
        spec = replace(spec, checkpoints=checkpoint_policy(s, world.checkpoints.root))
        register_run(
            store,
            spec,
            now,
            actor="simulator",
            message=f"simulated run registered: {spec.nodes} nodes x {s.gpus_per_node} GPUs, "
            f"{len(spec.spare_nodes)} named spares, seed {s.seed}",
        )
        if world.launcher is not None:
            store.channel_listening(now)  # the daemon's launcher channel listens from its start
            world.launcher.attach(store, spec.name)
        progress = ProgressWatch(world.trainer.opener, HangSettings(multiple=s.hang_multiple), ledger=store)
        # The real checkpoint watch: every restart is handed the newest *verified* save (a torn
        # one is never resumed from), checked through the CheckpointStore port like S3 or Lustre.
        watch = CheckpointWatch(lambda _spec: world.checkpoints, clock, inline=True, write_resume=world.write_resume)
        engine = Engine(
            scheduler=world.cluster,
            store=store,
            clock=clock,
            settings=EngineSettings(
                probe_confirm_s=s.probe_confirm_s,
                node_refresh_ticks=1,
                max_drains_per_hour=s.max_drains_per_hour,
                max_drains_per_run_per_hour=s.max_drains_per_hour,
                evidence_wait_s=s.agent_sample_s + s.poll_interval_s,
            ),
            probe=SimProbe(world.cluster),
            progress=progress,
            checkpoints=watch,
            health=world.health if s.node_agents else None,
        )
        return self._loop(engine, world, Pacing(s.poll_interval_s), end)

    def _loop(self, engine: Engine, world: World, pacing: Pacing, end: float) -> int:
        clock = world.clock
        engine.adopt()
        ticks = 0
        state = PacingState.start(pacing)
        launcher = world.launcher
        while clock.now() < end:
            if launcher is not None:
                launcher.poll()  # the daemon hears the launcher at each tick, as within a second
            result = engine.tick()
            if launcher is not None:
                launcher.poll()  # and the launcher reads a goal the tick wrote (its lag: launcher_poll_s)
            ticks += 1
            step, state = next_delay(pacing, state, result)
            if step.quiet and self.settings.skip_quiet_ticks:
                clock.advance_to(self._next_tick(engine, world, pacing.poll_interval_s, end))
            elif step.delay_s:
                clock.advance_to(min(end, clock.now() + step.delay_s))
            if ticks % 64 == 0:
                self._report(clock.now(), world.start, end)
        if launcher is not None:
            launcher.poll()
        engine.tick()  # the daemon reads the logs up to the end: the steps made are on record
        return ticks + 1

    def _next_tick(self, engine: Engine, world: World, poll: float, end: float) -> float:
        """The first tick of the poll grid at or after the next moment something could be seen."""
        clock = world.clock
        now = clock.now()
        candidates = [end, now + self.settings.max_skip_s]
        event = clock.next_event_time(foreground_only=True)
        if event is not None:
            candidates.append(event)
        a = world.trainer.current()
        deadline = engine.next_deadline()
        if deadline is not None and (a is None or not world.trainer.writes_by(a, max(deadline, now))):
            # Only a silence can run the hang detector's deadline out: a tick after a new line
            # reads it before it checks.
            candidates.append(deadline)
        if engine.recheck_at is not None:  # a decision's own time (a pre-queue due): new lines do not move it
            candidates.append(engine.recheck_at)
        if a is not None and a.last_read is None:
            # Its first line read on the real grid: when it began training after its resume (the
            # restart's cost) is on record as a real daemon would have it.
            first = [t for t in world.trainer.learning_times(a)[:1] if t > now]
            candidates += first
        hang = world.next_hang_ends_attempt(now)
        if a is not None and a.frozen_at is None and hang is not None:
            # This attempt will hang: its log is read on the real grid while the detector learns
            # the pace, and its last line before the hang is read when a real daemon would.
            # (An attempt that ends otherwise never meets a silence the detector could judge.)
            later = [t for t in world.trainer.learning_times(a) if t > now]
            if later:
                candidates.append(later[0])
            near = hang - world.trainer.lookahead_s(a)
            if near > now:
                candidates.append(near)
            else:
                last = world.trainer.last_line_before(a, hang)
                if last is not None and last > now:
                    candidates.append(last)
        target = min(candidates)
        k = max(1, math.ceil((target - now) / poll - 1e-9))
        return min(end, now + k * poll)

    def _report(self, now: float, start: float, end: float) -> None:
        if self.on_progress is not None:
            self.on_progress(min(1.0, (now - start) / (end - start)))


def _handmade_signal(settings: SimSettings) -> tuple[str, ...]:
    """The hand-made chain's ``#SBATCH --signal=B:USR1@LEAD`` (baseline mode, with a time limit)."""
    chain = settings.chain
    return () if chain.max_job_s is None else (f"--signal=B:USR1@{chain.lead_s}",)
