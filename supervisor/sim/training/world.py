"""The simulated world below the supervisor: cluster, trainer, failures, repairs, Slurm's own checks.

``World`` wires the ``SimCluster`` to the ``SimTrainer`` (each job incarnation runs one trainer
attempt), lands each drawn failure on a node of the run's job and makes it show the way it does
on a real cluster (see ``failures.Manifestation``):

* a GPU/ECC/NIC fault kills the job's processes at once (a trainer that saves on failure,
  ``survivors.py``: the other nodes' ranks save the step in progress first, then exit); the node
  stays broken until repaired, a job started on it dies at CUDA/NCCL init; Slurm's
  HealthCheckProgram drains it at its next check; the node agent (``SimHealthFeed``) reports it
  within one sample;
* a dead host takes slurmd down (Slurm: NOT_RESPONDING, DOWN after SlurmdTimeout; the direct probe
  sees it at once); the other ranks hang until NCCL's watchdog kills them;
* a hang stops progress; NCCL's watchdog kills the job after ``nccl_timeout_s``;
* fabric errors, software bugs and silent corruption kill the job and leave no node broken;
* a slow node slows every step of the job on it until repaired.

When the job's processes exit, the job script's exit status reaches Slurm: with the supervisor
the job ends FAILED; in the baseline the script's trap requeues it (``scontrol requeue``), the
usual way of getting automatic restarts from plain Slurm. In in-allocation mode the job
(``--no-kill``) runs the ``SimLauncher``: the processes that die are the step's, the job lives on,
and each step generation is a trainer attempt of its own (keyed job id, restart count, generation).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from supervisor.domain.cluster import JobState
from supervisor.sim.clock import Timer, VirtualClock
from supervisor.sim.faults.failures import Category, Failure, Manifestation
from supervisor.sim.faults.health import SimHealthFeed
from supervisor.sim.slurm.cluster import SimCluster
from supervisor.sim.slurm.records import Incarnation
from supervisor.sim.training.checkpoints import SimCheckpointStore
from supervisor.sim.training.launcher import SimLauncher
from supervisor.sim.training.results import Strike
from supervisor.sim.training.settings import Mode, SimSettings
from supervisor.sim.training.survivors import save_on_failure, step_at
from supervisor.sim.training.time_limits import TimeLimits
from supervisor.sim.training.trainer import Attempt, SimTrainer

NHC_REASON = "NHC: {what} failed"
_CRASH_NOW = (
    Manifestation.XID,
    Manifestation.ECC,
    Manifestation.NIC,
    Manifestation.NCCL_ERROR,
    Manifestation.SOFTWARE,
    Manifestation.SDC,
)
_BROKEN = (Manifestation.XID, Manifestation.ECC, Manifestation.NIC)


class World:
    def __init__(self, settings: SimSettings, mode: Mode, clock: VirtualClock, path_of: object = None) -> None:
        self.settings = settings
        self.mode = mode
        self.clock = clock
        self.start = clock.now()
        self.cluster = SimCluster(
            clock,
            settings.pool(mode),
            "gpu",
            slurmd_timeout=settings.slurmd_timeout_s / 3,
            down_after=settings.slurmd_timeout_s,
            cred_expire=settings.cred_expire_s,
            min_job_age=300.0,
            queue_wait=settings.chain.queue_wait(settings.seed),
            accrue_always=settings.chain.accrue_always,
        )
        self.checkpoints = SimCheckpointStore(clock)
        self.resume_files: dict[str, str] = {}  # the resume files the engine wrote (path -> JSON)
        self.trainer = SimTrainer(
            settings.trainer,
            clock,
            self.checkpoints,
            settings.seed,
            resume_uncommitted=mode is Mode.BASELINE,
            resume_files=self.resume_files,
        )
        self.health = SimHealthFeed(clock, self.cluster.node_names, settings.agent_sample_s)
        self.broken: dict[str, Category] = {}  # nodes with a lasting fault, until repaired
        self.slow: dict[str, float] = {}
        self.strikes: list[Strike] = []
        self.crash_restarts = 0
        self.survivor_saves: list[int] = []  # the steps the survivors of a crash began to save
        self.torn_restarts = 0
        self.hang_times: list[float] = []  # absolute times of drawn hangs, for the driver's look-ahead
        self.interrupt_times: list[float] = []  # of every drawn failure that stops a computing attempt
        self._attempts: dict[tuple[int, ...], Attempt] = {}  # per job incarnation: its newest attempt
        self._timers: dict[tuple[int, ...], list[Timer]] = {}  # an attempt's pending exits
        self.launcher = SimLauncher(self) if mode is Mode.IN_ALLOCATION else None
        if self.launcher is not None and settings.chain.max_job_s is not None:
            raise ValueError("the simulator models time limits for resubmitted jobs only, not in-allocation mode")
        self.limits = TimeLimits(self)
        self._last_nodes: tuple[str, ...] = self.cluster.node_names[: settings.nodes_per_job]
        self._path_of = path_of
        self.cluster.on_incarnation(self._incarnation)

    # -- setup ----------------------------------------------------------------------------------

    def schedule(self, failures: list[Failure]) -> None:
        for f in failures:
            when = self.start + f.at
            if f.category.shows is Manifestation.HANG:
                self.hang_times.append(when)
            if f.category.shows.interrupts:
                self.interrupt_times.append(when)
            self.clock.call_at(when, self._strike, f)
        self.limits.schedule()

    def log_path(self, job_id: int) -> str:
        if callable(self._path_of):
            return str(self._path_of(job_id))
        return f"/sim/logs/job-{job_id}.out"

    # -- the job's life -------------------------------------------------------------------------

    def _incarnation(self, kind: str, inc: Incarnation) -> None:
        key = (inc.job_id, inc.restart_count)
        if kind == "end":
            if self.launcher is not None:
                self.launcher.job_ended(inc)
            a = self._attempts.get(key)
            if a is not None:
                self.stop_attempt(a, inc.end if inc.end is not None else self.clock.now())
            return
        env = dict(self.cluster.job_request(inc.job_id).env)
        if self.launcher is not None:  # the batch script runs the launcher, which starts the step
            self.launcher.job_started(inc, env)
            self.limits.started(inc, None)
        else:
            self.limits.started(inc, self.run_attempt(key, inc.nodes, env))

    def write_resume(self, path: str, text: str) -> None:
        """The engine's resume file (``CheckpointWatch``'s writer): kept for the trainer to read."""
        self.resume_files[path] = text

    def run_attempt(
        self, key: tuple[int, ...], nodes: tuple[str, ...], env: dict[str, str], startup_s: float | None = None
    ) -> Attempt:
        """The trainer's processes start on ``nodes`` (``key``: job id, restart count[, generation])."""
        slow = max((self.slow.get(n, 1.0) for n in nodes), default=1.0)
        a = self.trainer.start(key, self.log_path(key[0]), nodes, env, slow, startup_s)
        self._attempts[key[:2]] = a
        self._last_nodes = nodes
        bad = sorted(n for n in nodes if n in self.broken)
        if bad:
            self.crash_restarts += 1
            self.later(a, a.started_at + self.settings.trainer.crash_at_start_s, self._exit)
        elif a.resume_torn:
            self.torn_restarts += 1
            self.later(a, a.computing_at, self._exit)
        if a.exit_at is not None:  # doomed, or resuming from an unloadable save (TrainerSettings)
            self.later(a, a.exit_at, self._exit)
        return a

    def stop_attempt(self, a: Attempt, at: float | None = None) -> None:
        """The attempt's processes are gone (its job ended, or the launcher stopped its step)."""
        self.trainer.end(a, self.clock.now() if at is None else at)
        for timer in self._timers.pop(a.key, []):
            timer.cancel()  # a watchdog or crash of an attempt that is gone is no event

    def later(self, a: Attempt, when: float, fn: Callable[..., None], *args: object) -> None:
        """``fn(a, *args)`` at ``when``, unless the attempt's processes are gone by then."""
        self._timers.setdefault(a.key, []).append(self.clock.call_at(when, fn, a, *args))

    def _exit(self, a: Attempt) -> None:
        """The attempt's processes exit with an error (crash, watchdog, failed load)."""
        if not a.active:
            return
        job_id = a.key[0]
        try:
            info = self.cluster.job_info(job_id)
        except Exception:  # noqa: BLE001 - the job was purged: nothing left to exit
            return
        if info.state is not JobState.RUNNING or info.restart_count != a.key[1]:
            return
        if self.launcher is not None:  # --no-kill: the step dies, the job and its launcher live on
            self.stop_attempt(a)
            self.launcher.step_exited(a)
            return
        if self.mode is Mode.BASELINE:
            self.cluster.requeue(job_id)  # the job script's trap: scontrol requeue $SLURM_JOB_ID
        else:
            self.cluster.finish_job(job_id, 1)
        if a.active:  # the batch host was dead: the processes elsewhere just go
            self.trainer.end(a, self.clock.now())

    def _watchdog(self, a: Attempt) -> None:
        if a.active and a.frozen_at is not None:
            self._exit(a)

    # -- failures -------------------------------------------------------------------------------

    def _strike(self, f: Failure) -> None:
        now = self.clock.now()
        a = self.trainer.current()
        computing = a is not None and a.frozen_at is None
        nodes = a.nodes if a is not None else self._last_nodes
        node = f.lands_on(nodes, self.cluster.node_names)
        if node is None:
            return  # a replayed trace's node that this cluster does not have
        cat, shows = f.category, f.category.shows
        interrupts = computing and shows.interrupts and node in nodes
        strike = Strike(
            now, cat.component, shows.value, node, interrupts, self.trainer.reached(a, now) if a is not None else None
        )
        self.strikes.append(strike)
        self.health.fault(node, cat, now, f.u_phase)
        repair_s = f.repair_time(self.settings.repair)
        if shows in _BROKEN:
            self.broken[node] = cat
            nhc_at = now + f.u_phase * self.settings.health_check_s
            self.clock.call_at(nhc_at, self._health_check, node, cat)
        elif shows is Manifestation.HOST_DOWN:
            self.cluster.crash_node(node)
        elif shows is Manifestation.STRAGGLER:
            self.slow[node] = self.settings.straggler_slowdown
            if a is not None and node in a.nodes:
                self.trainer.set_slow(a, self.settings.straggler_slowdown)
        if a is not None and interrupts:
            if shows in _CRASH_NOW:
                self._crash(a, shows, now)
            elif shows in (Manifestation.HANG, Manifestation.HOST_DOWN):
                self.trainer.freeze(a, now)
                self.later(a, now + self.settings.nccl_timeout_s, self._watchdog)
        if repair_s > 0 and shows not in (
            Manifestation.NCCL_ERROR,
            Manifestation.SOFTWARE,
            Manifestation.SDC,
            Manifestation.HANG,
        ):
            self.clock.call_at(now + repair_s, self._repair, node)

    def _crash(self, a: Attempt, shows: Manifestation, now: float) -> None:
        """The job's processes die now — unless the trainer saves on failure and the crash leaves
        survivors with the state: they save the step in progress first and exit when it is written
        (a stop before then, by the supervisor, tears it: ``stop_attempt`` cancels this exit)."""
        exit_at = save_on_failure(self.trainer, a, shows, now)
        if exit_at is not None and exit_at > now:
            self.survivor_saves.append(step_at(self.trainer, a, now))
        if exit_at is None or exit_at <= now:
            self._exit(a)
        else:
            self.later(a, exit_at, self._exit)

    def _health_check(self, node: str, cat: Category) -> None:
        if self.broken.get(node) is cat:
            what = {Manifestation.NIC: "IB port check"}.get(cat.shows, "GPU check")
            self.cluster.health_check_drain(node, NHC_REASON.format(what=what))

    def _repair(self, node: str) -> None:
        self.broken.pop(node, None)
        self.slow.pop(node, None)
        self.health.repaired(node)
        self.cluster.repair_node(node)

    # -- ground truth at the end ----------------------------------------------------------------

    def next_hang_ends_attempt(self, now: float) -> float | None:
        """When the next interrupting failure after ``now`` is a hang: its time (else None)."""
        i = bisect.bisect_right(self.interrupt_times, now)
        if i >= len(self.interrupt_times):
            return None
        j = bisect.bisect_right(self.hang_times, now)
        return (
            self.hang_times[j] if j < len(self.hang_times) and self.hang_times[j] == self.interrupt_times[i] else None
        )

    def kept_steps(self) -> int:
        """Progress that survives: the running attempt's step, else the checkpoint a restart loads."""
        a = self.trainer.current()
        if a is not None and a.frozen_at is None and a.computing_at <= self.clock.now():
            return self.trainer.reached(a)
        save = self.checkpoints.newest(committed_only=True)
        return save.step if save is not None else 0

    def attempts(self) -> list[Attempt]:
        return list(self.trainer.attempts)

    def survivor_saves_torn(self) -> int:
        """The survivors' saves stopped before they were written (by a cancel or a relaunch)."""
        return sum(1 for step in self.survivor_saves if not self._committed(step))

    def _committed(self, step: int) -> bool:
        save = self.checkpoints.get(step)
        return save is not None and save.committed(self.clock.now())
