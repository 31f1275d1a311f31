"""The reconcile tick: observe (one snapshot, facts returned), decide (pure, per run), execute
(the only writer: records applied, actions journaled and performed).

A crash between any two lines is recovered by the next tick: open intents are settled against a
fresh snapshot before anything new is decided, and every record is idempotent.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import structlog

from supervisor.domain.actions import Decision
from supervisor.domain.checkpoints.memory import memory_for_relaunch
from supervisor.domain.checkpoints.resume import ResumePlan
from supervisor.domain.cluster import ClusterSnapshot
from supervisor.domain.decide.blast import (
    WINDOW_S,
    BlastRadius,
    HookDrain,
    drains_left,
    hook_drained,
    track_hook_drains,
)
from supervisor.domain.decide.policy import Observation, Policy, decide
from supervisor.domain.health.findings import HeartbeatSettings
from supervisor.domain.health.quarantine import QuarantineSettings
from supervisor.domain.records import EventKind, RunRecord
from supervisor.domain.run import IllegalTransition, RunState
from supervisor.engine.act.execute import CrashHook, Executor, run_event
from supervisor.engine.facts.hang_stacks import HangStacks
from supervisor.engine.facts.nodes import NodeWatch, forget_returned
from supervisor.engine.facts.observe import NodeRoster, Observer
from supervisor.engine.facts.probes import ProbeTracker
from supervisor.engine.watch.checkpoints import CheckpointWatch
from supervisor.engine.watch.nulls import NoCheckpoints, NoHealthFeed, NoProgress
from supervisor.engine.watch.progress import ProgressWatch
from supervisor.ports import (
    Accounting,
    Clock,
    Fencer,
    HealthFeed,
    NodeGuard,
    NodeProbe,
    PermanentError,
    Scheduler,
    Store,
    TransientError,
)

log = structlog.get_logger("supervisor.engine")

__all__ = ["CrashHook", "Engine", "EngineSettings", "TickResult"]


@dataclass(frozen=True)
class EngineSettings:
    may_change_nodes: bool = True
    max_drains_per_hour: int = 8
    probe_confirm_s: float = 1.0
    # Node info (sinfo: 2 controller RPCs) is read every tick while anything is in motion, else
    # every n-th tick; job info (squeue: 1 RPC) every tick. 3 → 1.67 RPCs per quiet tick.
    node_refresh_ticks: int = 3
    max_drains_per_run_per_hour: int = 4
    heartbeat: HeartbeatSettings = HeartbeatSettings()
    finding_ttl_s: float = 3600.0  # a node finding not repeated for this long is forgotten
    quarantine: QuarantineSettings = QuarantineSettings()
    # where node agents and launchers report (handed to jobs with the run's token): this daemon's
    # URL, then its peers' on the other login nodes, comma-separated ([ingest] peer_urls)
    ingest_url: str | None = None
    # An unexplained job death on nodes with agents waits this long for their evidence (an XID is
    # reported at the agent's next sample) before restarting: not back onto the broken node.
    evidence_wait_s: float = 12.0
    # A run that cannot be placed (too few nodes in service that it may use) pages after this long.
    stuck_page_s: float = 1800.0
    # Slurm's controller silent for longer than this is one entry in each active run's logbook.
    outage_logged_after_s: float = 10.0
    # Slurm's KillWait (read from its configuration at start): how long a process Slurm is killing
    # on a responding node may live on, so how long a restart waits on a job still completing.
    kill_wait_s: float = 30.0
    # The account this instance runs as (domain.observation.account_label): the reasons it puts on
    # nodes name it, and only those are its own (issue 32, finding 12). Empty in the simulator.
    account: str = ""


@dataclass
class TickResult:
    ok: bool
    acted: bool = False
    error: str | None = None
    retry_in: float | None = None
    decisions: dict[str, Decision] = field(default_factory=dict)
    urgent: bool = False  # a recovery or a suspect node is in progress: tick again soon
    confirm_in: float | None = None  # seconds until a suspect node's probes can confirm its death


class Engine:
    def __init__(
        self,
        *,
        scheduler: Scheduler,
        store: Store,
        clock: Clock,
        settings: EngineSettings = EngineSettings(),
        probe: NodeProbe | None = None,
        fencer: Fencer | None = None,
        crash_hook: CrashHook | None = None,
        progress: ProgressWatch | None = None,
        checkpoints: CheckpointWatch | None = None,
        health: HealthFeed | None = None,
        accounting: Accounting | None = None,
        guard: NodeGuard | None = None,
        stacks: HangStacks | None = None,
    ) -> None:
        self.store, self.clock, self.settings = store, clock, settings
        self.progress = progress or NoProgress()
        self.checkpoints = checkpoints or NoCheckpoints()
        self._agents_report = health is not None  # evidence from node agents is worth waiting for
        self.probes = ProbeTracker(probe, settings.probe_confirm_s)
        nodes = NodeWatch(health or NoHealthFeed(), settings.heartbeat, settings.finding_ttl_s)
        self.observer = Observer(
            scheduler=scheduler, store=store, clock=clock, probes=self.probes, progress=self.progress,
            checkpoints=self.checkpoints, nodes=nodes, quarantine=settings.quarantine,
            node_refresh_ticks=settings.node_refresh_ticks, accounting=accounting, guard=guard,
            account=settings.account,
            roster=health if isinstance(health, NodeRoster) else None,  # a run's token: its job's nodes only
            stacks=stacks,
        )  # fmt: skip
        self.executor = Executor(
            scheduler=scheduler, store=store, clock=clock, fencer=fencer, resume_for=self._resume_for,
            ingest_url=settings.ingest_url, node_rights=settings.may_change_nodes, crash_hook=crash_hook,
            guard=guard,
        )  # fmt: skip
        self.checkpoints.write_through(self.executor.apply)
        self._recheck_at: float | None = None  # a decision waits for evidence (or a page) until then
        self._urgent = True
        self._waiting: set[str] = set()  # runs that cannot be placed: nodes read every tick, no urgency
        self._outage: tuple[float, str] | None = None  # Slurm silent since, and its last error
        self._hook_drains: dict[str, float] = {}  # node drained by a Slurm hook -> first seen so (blast radius)
        self._hooked_in: ClusterSnapshot | None = None  # the snapshot _hook_drains was last read from

    # ------------------------------------------------------------------ the tick

    def tick(self) -> TickResult:
        try:
            placing = bool(self._waiting) or self._in_motion()  # a run is being placed: its partition
            snap = self.observer.snapshot(nodes_needed=self._urgent or placing, cluster_needed=placing)
        except TransientError as exc:
            log.warning("slurm_unreachable", error=str(exc), retry_in=exc.delay)
            self._outage = self._outage or (self.clock.now(), str(exc))
            return TickResult(ok=False, error=str(exc), retry_in=exc.delay)
        except PermanentError as exc:  # an answer we cannot read: observe nothing, act on nothing
            log.error("slurm_snapshot_unreadable", error=str(exc))
            return TickResult(ok=False, error=str(exc), retry_in=30.0)
        self._outage_over()
        result = TickResult(ok=True)
        try:
            blocked, result.acted = self.executor.settle_open_intents(snap)
            facts = self.observer.gather(self.store.runs(active_only=True), snap)
            self.executor.apply(facts.records)
            runs = self.store.runs(active_only=True)
            obs = self.observer.observation(runs, snap, facts)
            self._decide_all(runs, obs, blocked, result)
            if not blocked:  # a run waiting on an intent has not seen the returned nodes yet: next tick
                self.executor.apply(forget_returned(obs.returned, self.clock.now()))
        except TransientError as exc:
            log.warning("tick_interrupted", error=str(exc), retry_in=exc.delay)
            result.ok, result.error, result.retry_in = False, str(exc), exc.delay
        result.urgent = result.acted or bool(self.probes.suspects) or self._in_motion()
        result.confirm_in = self.probes.confirm_in(self.clock.now())
        self._urgent = result.urgent
        return result

    def next_deadline(self) -> float | None:
        """The earliest time at which the engine's own timers (hang detection, a wait for node
        evidence, a page due) could act although nothing else changed; None when it has none.
        The simulator skips quiet ticks up to it."""
        hang = self.progress.next_deadline(self.clock.now())
        times = [t for t in (hang, self._recheck_at) if t is not None]
        return min(times) if times else None

    @property
    def recheck_at(self) -> float | None:
        """When a decision asked to be looked at again (a pre-queue due, an evidence wait), None: none."""
        return self._recheck_at

    def adopt(self) -> list[RunRecord]:
        """At daemon start: note in each active run's logbook that this daemon took it over."""
        now = self.clock.now()
        runs = self.store.runs(active_only=True)
        for run in runs:
            job = f"job {run.attempt.job_id}" if run.attempt else "no job yet"
            message = f"daemon re-adopted the run ({run.state}, {job})"
            self.executor.apply([run_event(run, EventKind.ADOPTED, message, f"{run.name}:adopted:{now:.6f}", now)])
        return runs

    def _outage_over(self) -> None:
        """Slurm answers again: an outage longer than ``outage_logged_after_s`` is one entry in
        every active run's logbook — on-call sees why nothing happened meanwhile."""
        if self._outage is None:
            return
        (since, error), self._outage = self._outage, None
        now = self.clock.now()
        if now - since <= self.settings.outage_logged_after_s:
            return
        message = (
            f"Slurm's controller did not answer for {now - since:.0f} s (since {since:.0f}); nothing was "
            f"observed or decided meanwhile; last error: {error[:300]}"
        )
        self._log_outage(EventKind.CONTROLLER_OUTAGE, message, since, now, error)

    def store_outage_over(self, since: float, until: float, error: str) -> None:
        """The shared store answered again after ``since`` (the leader, on its first claim since):
        one entry in every active run's logbook, written now that it can be. Transient errors
        propagate: the caller tries again at its next claim (the key makes a retry write once)."""
        if until - since <= self.settings.outage_logged_after_s:
            return
        message = (
            f"the store (PostgreSQL) did not answer for {until - since:.0f} s (since {since:.0f}); nobody "
            f"observed or acted meanwhile; last error: {error[:300]}"
        )
        self._log_outage(EventKind.STORE_OUTAGE, message, since, until, error)

    def _log_outage(self, kind: EventKind, message: str, since: float, until: float, error: str) -> None:
        evidence = {"since": since, "until": until, "error": error[:300]}
        key = "outage" if kind is EventKind.CONTROLLER_OUTAGE else kind.value
        now = self.clock.now()
        events = [
            replace(run_event(r, kind, message, f"{r.name}:{key}:{since:.0f}", now), evidence=evidence)
            for r in self.store.runs(active_only=True)
        ]
        self.executor.apply(events)

    def _in_motion(self) -> bool:
        if self.store.open_actions():
            return True
        motion = (RunState.REGISTERED, RunState.RECOVERING)
        return any(
            (r.state in motion and r.name not in self._waiting) or r.cancel_requested
            for r in self.store.runs(active_only=True)
        )

    # ------------------------------------------------------------------ decide and execute

    def _decide_all(self, runs: list[RunRecord], obs: Observation, blocked: set[str], result: TickResult) -> None:
        self._recheck_at = None
        self._waiting = set()
        for run in runs:
            if run.name not in blocked:
                self._reconcile_run(run, obs, result)

    def _reconcile_run(self, run: RunRecord, obs: Observation, result: TickResult) -> None:
        structlog.contextvars.bind_contextvars(run=run.name, job_id=run.attempt.job_id if run.attempt else None)
        try:
            decision = decide(run, obs, self._policy(run, obs))
            self._note(run, decision)
            result.decisions[run.name] = decision
            self.executor.apply(decision.records)
            result.acted |= self.executor.carry_out(run, decision.actions)
        except (PermanentError, IllegalTransition) as exc:
            # One run's inconsistency must not stop the supervision of the others: say it loudly,
            # once in the run's logbook, and try again next tick on fresh state.
            log.error("run_reconcile_failed", error=str(exc), error_type=type(exc).__name__)
            now = self.clock.now()
            message = f"the supervisor could not act on this run: {exc}"
            self.executor.apply([run_event(run, EventKind.WARNING, message, f"{run.name}:reconcile-failed:{exc}", now)])
        finally:
            structlog.contextvars.unbind_contextvars("run", "job_id")

    def _policy(self, run: RunRecord, obs: Observation) -> Policy:
        s = self.settings
        now = self.clock.now()
        caps = BlastRadius(s.max_drains_per_hour, s.max_drains_per_run_per_hour)
        hooked = self._hooked(obs, now)
        mine = run.attempt.nodes if run.attempt else ()
        left = drains_left(self.store.node_changes(now - WINDOW_S), run.name, now, caps, hooked, mine)
        left = 0 if self.executor.guard_capped(now) else left  # the node guard's cluster-wide cap
        return Policy(
            may_change_nodes=self.executor.node_rights,
            drains_left=left,
            fence=self.executor.fencer is not None,
            evidence_wait_s=s.evidence_wait_s if self._agents_report else 0.0,
            stuck_page_s=s.stuck_page_s,
            when_short=s.quarantine.when_short,
            storm=left == 0 and min(caps.per_hour, caps.per_run_per_hour) > 0,  # spent, not merely zero
            kill_wait_s=s.kill_wait_s,
        )

    def _hooked(self, obs: Observation, now: float) -> list[HookDrain]:
        """Nodes Slurm's hooks drained, read from the tick's snapshot once, not once per run (a
        walk over every node)."""
        if self._hooked_in is not obs.snapshot:
            drained = hook_drained(obs.snapshot.nodes.values())
            self._hook_drains = track_hook_drains(self._hook_drains, drained, now)
            self._hooked_in = obs.snapshot
        return [HookDrain(n, at) for n, at in self._hook_drains.items()]

    def _note(self, run: RunRecord, decision: Decision) -> None:
        """What the decision asks of the loop: look again at a given time, or wait for nodes."""
        if decision.waiting:
            self._waiting.add(run.name)
        if decision.recheck_at is not None:
            self._recheck_at = min(decision.recheck_at, self._recheck_at or decision.recheck_at)

    def _resume_for(self, run: RunRecord, *, in_job: bool = False) -> ResumePlan | None:
        """The resume plan for the run's next attempt, with the logbook lines choosing it left
        (checkpoints passed over, a resume file that could not be written) written first. A
        relaunch in the job names the newest peer copies in memory its log reported when newer."""
        plan = self.checkpoints.resume_for(run, self.store)
        a = run.attempt
        if plan is None or not in_job or a is None:
            return plan
        newest = self.progress.memory(a.job_id, a.restart_count)
        return replace(plan, memory=memory_for_relaunch(newest, plan.step, plan.rollback is not None))
