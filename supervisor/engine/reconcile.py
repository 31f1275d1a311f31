"""The reconcile tick: observe (one snapshot), decide (pure, per run), act (journaled), record.

A crash between any two lines is recovered by the next tick: open intents are settled against a
fresh snapshot before anything new is decided, and every record is idempotent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from supervisor.domain.actions import (
    Action,
    AttemptEnded,
    AttemptRequeued,
    AttemptStarted,
    Cancel,
    ChangeNode,
    Decision,
    Defer,
    Exclude,
    Fence,
    Release,
    SetExcluded,
    SetState,
    Submit,
    Unexclude,
)
from supervisor.domain.blast import WINDOW_S, BlastRadius, NodeChangeRecord, drains_left
from supervisor.domain.cluster import ClusterSnapshot, JobState, NodeChange
from supervisor.domain.health import HeartbeatSettings, NodeFinding, Severity, stale_heartbeats, worst
from supervisor.domain.lemon import Fault, Quarantine, QuarantineSettings, quarantined
from supervisor.domain.policy import REASON_PREFIX, Observation, Policy, decide
from supervisor.domain.records import Event, EventKind, NodeVerdict, RunRecord, Verdict
from supervisor.domain.resume import describe_plan
from supervisor.domain.run import IllegalTransition, RunState
from supervisor.engine.checkpoints import CheckpointWatch
from supervisor.engine.intents import action_from, effect_present, params_of, submit_request, submit_tag
from supervisor.engine.probes import ProbeTracker
from supervisor.engine.progress import ProgressWatch
from supervisor.engine.spikes import handle_spikes, pending_rollbacks
from supervisor.ports import (
    Clock,
    Fencer,
    HealthFeed,
    NodeProbe,
    PermanentError,
    PermissionDenied,
    PortError,
    Scheduler,
    Store,
    TransientError,
)

log = structlog.get_logger("supervisor.engine")

CrashHook = Callable[[str, str], None]  # (boundary, action kind) -> may raise or exit


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
    ingest_url: str | None = None  # where node agents report (handed to jobs with the run's token)
    # An unexplained job death on nodes with agents waits this long for their evidence (an XID is
    # reported at the agent's next sample) before restarting: not back onto the broken node.
    evidence_wait_s: float = 12.0
    # A run that cannot be placed (too few nodes in service that it may use) pages after this long.
    stuck_page_s: float = 1800.0


@dataclass
class TickResult:
    ok: bool
    acted: bool = False
    error: str | None = None
    retry_in: float | None = None
    decisions: dict[str, Decision] = field(default_factory=dict)
    urgent: bool = False  # a recovery or a suspect node is in progress: tick again soon


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
    ) -> None:
        self.scheduler = scheduler
        self.store = store
        self.clock = clock
        self.settings = settings
        self.fencer = fencer
        self.progress = progress
        self.checkpoints = checkpoints
        self.health = health
        self._findings: dict[str, NodeFinding] = {}  # node -> active finding (degraded or fatal)
        self._recheck_at: float | None = None  # a decision waits for evidence until then
        self.probes = ProbeTracker(probe, settings.probe_confirm_s)
        self._crash = crash_hook or (lambda boundary, kind: None)
        self._node_rights = settings.may_change_nodes
        self._nodes: Mapping[str, Any] | None = None  # the last node info read from Slurm
        self._ticks = 0
        self._urgent = True
        self._waiting: set[str] = set()  # runs that cannot be placed: nodes are read every tick, no urgency

    # ------------------------------------------------------------------ the tick

    def tick(self) -> TickResult:
        try:
            snap = self._observe()
        except TransientError as exc:
            log.warning("slurm_unreachable", error=str(exc), retry_in=exc.delay)
            return TickResult(ok=False, error=str(exc), retry_in=exc.delay)
        except PermanentError as exc:  # an answer we cannot read: observe nothing, act on nothing
            log.error("slurm_snapshot_unreadable", error=str(exc))
            return TickResult(ok=False, error=str(exc), retry_in=30.0)
        result = TickResult(ok=True)
        try:
            blocked = self._settle_open_intents(snap, result)
            runs = self.store.runs(active_only=True)
            dead = self.probes.update(self._running_nodes(runs, snap), snap, self.clock.now())
            hangs = self.progress.update(runs, snap, self.clock.now()) if self.progress else {}
            if self.progress is not None:
                runs = self._record_progress(runs)
                watch = self.checkpoints
                handle_spikes(
                    self.progress.take_notices(),
                    runs,
                    self.store,
                    self.clock,
                    (lambda r: watch.refresh(r, self.store)) if watch is not None else None,
                )
                self._record_slowdowns(runs)
            checkpoint_at: dict[str, float] = {}
            if self.checkpoints is not None:
                self.checkpoints.update(runs, self.store)
                checkpoint_at = self.checkpoints.verified_at([r for r in runs if r.deferred], self.store)
            dead = {**self._stale_agents(runs, snap), **dead}
            returned = self._returned(snap)
            for node in returned:  # an old finding must not fault the run that lands there next
                self._findings.pop(node, None)
            obs = Observation(
                snap,
                dead,
                hangs,
                self._active_findings(runs, snap),
                self._quarantined(),
                checkpoint_at,
                pending_rollbacks(runs, self.store),
                returned,
                self._agents(),
            )
            self._recheck_at = None
            self._waiting = set()
            for run in runs:
                if run.name in blocked:
                    continue
                self._reconcile_run(run, obs, result)
            self._forget_returned(returned, blocked)
        except TransientError as exc:
            log.warning("tick_interrupted", error=str(exc), retry_in=exc.delay)
            result.ok, result.error, result.retry_in = False, str(exc), exc.delay
        result.urgent = result.acted or bool(self.probes.suspects) or self._in_motion()
        self._urgent = result.urgent
        return result

    def next_deadline(self) -> float | None:
        """The earliest time at which the engine's own timers (hang detection, a wait for node
        evidence) could act although nothing else changed; None when it has none. The simulator
        skips quiet ticks up to it."""
        hang = self.progress.next_deadline(self.clock.now()) if self.progress else None
        times = [t for t in (hang, self._recheck_at) if t is not None]
        return min(times) if times else None

    def _observe(self) -> ClusterSnapshot:
        """Jobs every tick; nodes when anything is in motion or every ``node_refresh_ticks``."""
        self._ticks += 1
        fresh = (
            self._nodes is None
            or self._urgent
            or bool(self._waiting)
            or self._in_motion()
            or self._ticks % max(1, self.settings.node_refresh_ticks) == 0
        )
        snap = self.scheduler.snapshot(include_nodes=fresh)
        if not fresh and self._a_job_moved(snap):  # decisions on a job's start or end read its nodes' state
            snap, fresh = self.scheduler.snapshot(include_nodes=True), True
        if fresh:
            self._nodes = snap.nodes
            return snap
        return ClusterSnapshot(snap.taken_at, snap.jobs, self._nodes or {})

    def _a_job_moved(self, snap: ClusterSnapshot) -> bool:
        """A job of ours ended, or started since it was last seen (maybe on a node that came back
        since the node info was read: stale info would call that node down)."""
        for run in self.store.runs(active_only=True):
            a = run.attempt
            if a is not None and a.ended_at is None:
                job = snap.jobs.get(a.job_id)
                if job is None or job.state.finished or (a.started_at is None and job.state is not JobState.PENDING):
                    return True
        return False

    def _in_motion(self) -> bool:
        if self.store.open_actions():
            return True
        motion = (RunState.REGISTERED, RunState.RECOVERING)
        return any(
            (r.state in motion and r.name not in self._waiting) or r.cancel_requested
            for r in self.store.runs(active_only=True)
        )

    def adopt(self) -> list[RunRecord]:
        """At daemon start: note in each active run's logbook that this daemon took it over."""
        now = self.clock.now()
        runs = self.store.runs(active_only=True)
        for run in runs:
            job = f"job {run.attempt.job_id}" if run.attempt else "no job yet"
            self.store.record_event(
                Event(
                    run.name,
                    EventKind.ADOPTED,
                    f"daemon re-adopted the run ({run.state}, {job})",
                    f"{run.name}:adopted:{now:.6f}",
                    now,
                    run.attempt.seq if run.attempt else None,
                    run.attempt.job_id if run.attempt else None,
                )
            )
        return runs

    def _reconcile_run(self, run: RunRecord, obs: Observation, result: TickResult) -> None:
        structlog.contextvars.bind_contextvars(run=run.name, job_id=run.attempt.job_id if run.attempt else None)
        try:
            policy = Policy(
                self._node_rights,
                self._drains_left(run.name),
                self.fencer is not None,
                self.settings.evidence_wait_s if self.health is not None else 0.0,
                self.settings.stuck_page_s,
                self.settings.quarantine.when_short,
            )
            decision = decide(run, obs, policy)
            if decision.notes.get("waiting"):
                self._waiting.add(run.name)
            recheck = decision.notes.get("recheck_at")
            if recheck is not None:
                self._recheck_at = min(recheck, self._recheck_at or recheck)
            result.decisions[run.name] = decision
            self._apply_records(decision.records)
            fresh = self.store.get_run(run.name) or run
            for action in decision.actions:
                if isinstance(action, ChangeNode) and not self._node_rights:
                    continue  # refused once already in this daemon's life; the node stays excluded
                self._execute(fresh, action, obs.snapshot)
                result.acted = True
                fresh = self.store.get_run(run.name) or fresh
        except (PermanentError, IllegalTransition) as exc:
            # One run's inconsistency must not stop the supervision of the others: say it loudly,
            # once in the run's logbook, and try again next tick on fresh state.
            log.error("run_reconcile_failed", error=str(exc), error_type=type(exc).__name__)
            now = self.clock.now()
            self.store.record_event(
                Event(
                    run.name,
                    EventKind.WARNING,
                    f"the supervisor could not act on this run: {exc}",
                    f"{run.name}:reconcile-failed:{exc}",
                    now,
                    run.attempt.seq if run.attempt else None,
                    run.attempt.job_id if run.attempt else None,
                )
            )
        finally:
            structlog.contextvars.unbind_contextvars("run", "job_id")

    def _record_progress(self, runs: list[RunRecord]) -> list[RunRecord]:
        """Each current attempt's newest logged step and step time, into the store: decisions that
        read them (did a resumed checkpoint load?) must make the same choice after a daemon restart."""
        assert self.progress is not None
        out = []
        for run in runs:
            a = run.attempt
            step = self.progress.last_step(a.job_id, a.restart_count) if a is not None else None
            if a is not None and step is not None and step != a.last_step:
                pace = self.progress.step_time(a.job_id, a.restart_count)
                self.store.attempt_progress(run.name, a.seq, step, pace)
                run = replace(run, attempt=replace(a, last_step=step, step_time_s=pace or a.step_time_s))
            out.append(run)
        return out

    def _running_nodes(self, runs: list[RunRecord], snap: ClusterSnapshot) -> set[str]:
        nodes: set[str] = set()
        for run in runs:
            job = snap.jobs.get(run.attempt.job_id) if run.attempt else None
            if job is not None and not job.state.finished:
                nodes.update(job.nodes)
        return nodes

    def _drains_left(self, run: str) -> int:
        caps = BlastRadius(self.settings.max_drains_per_hour, self.settings.max_drains_per_run_per_hour)
        now = self.clock.now()
        return drains_left(self.store.node_changes(now - WINDOW_S), run, now, caps)

    # ------------------------------------------------------------------ node health

    def _active_findings(self, runs: list[RunRecord], snap: ClusterSnapshot) -> dict[str, NodeFinding]:
        """Drain the health feed; keep each node's worst degraded or fatal finding for a while."""
        now = self.clock.now()
        new = self.progress.take_findings() if self.progress is not None else []
        if self.health is not None:
            new += self.health.drain_findings()
        if new:
            for node, found in worst(new).items():
                if found.severity is Severity.WATCH:
                    log.info("node_watch", node=node, reason=found.reason, rule=found.rule)
                    continue
                cur = self._findings.get(node)
                if (
                    cur is None
                    or found.severity.rank >= cur.severity.rank
                    or now - cur.at > self.settings.finding_ttl_s
                ):
                    self._findings[node] = found
                    self._note_outside_runs(found, runs, snap)
        ttl = self.settings.finding_ttl_s
        self._findings = {n: f for n, f in self._findings.items() if now - f.at <= ttl and not _acted_on(snap, n)}
        return dict(self._findings)

    def _record_slowdowns(self, runs: list[RunRecord]) -> None:
        assert self.progress is not None
        by_name = {r.name: r for r in runs}
        for name, key, evidence in self.progress.take_slowdowns():
            run = by_name.get(name)
            a = run.attempt if run else None
            if a is None or (a.job_id, a.restart_count) != key:
                continue
            blame = evidence.get("stragglers") or {}
            linked = f"; explained by straggler {', '.join(sorted(blame))}" if blame else "; no straggler named"
            self.store.record_event(
                Event(
                    name,
                    EventKind.SLOWDOWN,
                    f"{a.label}: slowdown: {evidence['reason']}{linked}",
                    f"{name}:{a.seq}:slowdown",
                    self.clock.now(),
                    a.seq,
                    a.job_id,
                    evidence=evidence,
                )
            )

    def _note_outside_runs(self, found: NodeFinding, runs: list[RunRecord], snap: ClusterSnapshot) -> None:
        """A finding on a node none of our runs uses: remembered as the node's verdict."""
        if found.node in self._running_nodes(runs, snap):
            return  # the run's decision records it, with the run's context
        verdict = Verdict.BAD if found.severity is Severity.FATAL else Verdict.SUSPECT
        self.store.set_verdict(
            NodeVerdict(
                found.node,
                verdict,
                found.reason,
                {"rule": found.rule, "source": found.source, **found.evidence},
                found.run,
                None,
                found.at,
            )
        )

    def _agents(self) -> frozenset[str]:
        """Nodes whose agent reported within the heartbeat timeout."""
        if self.health is None:
            return frozenset()
        limit = self.settings.heartbeat.timeout_s
        return frozenset(n for n, age in self.health.heartbeat_ages(self.clock.now()).items() if age <= limit)

    def _stale_agents(self, runs: list[RunRecord], snap: ClusterSnapshot) -> dict[str, str]:
        """Nodes whose agent stopped reporting while the job's other nodes' agents still report."""
        if self.health is None:
            return {}
        now = self.clock.now()
        ages = self.health.heartbeat_ages(now)
        stale: dict[str, str] = {}
        for run in runs:
            job = snap.jobs.get(run.attempt.job_id) if run.attempt else None
            if job is None or job.state.finished or run.attempt is None or run.attempt.started_at is None:
                continue
            stale.update(stale_heartbeats(job.nodes, ages, now - run.attempt.started_at, self.settings.heartbeat))
        return stale

    def _returned(self, snap: ClusterSnapshot) -> frozenset[str]:
        """Nodes judged bad or suspect that were out of service in Slurm — drained or downed by
        this supervisor, by Slurm's health check or by an admin — and are back in service now.
        A node kept out that Slurm has in service is marked the first time it is seen out of
        service (``held-by-slurm``): one that was never out (no node rights, over the blast radius)
        is not "back" and stays out."""
        out = set()
        for v in self.store.verdicts():
            info = snap.nodes.get(v.node)
            if info is None or v.verdict is Verdict.HEALTHY:
                continue
            in_service = info.responding and not info.down and not info.drained
            if in_service and v.action in OUT_OF_SERVICE:
                out.add(v.node)
            elif not in_service and v.action not in OUT_OF_SERVICE:
                self.store.set_node_action(v.node, "held-by-slurm", self.clock.now())
        return frozenset(out)

    def _forget_returned(self, returned: frozenset[str], blocked: set[str]) -> None:
        if blocked:
            return  # a run waiting on an intent has not seen them yet: next tick
        now = self.clock.now()
        for node in returned:
            self.store.set_verdict(
                NodeVerdict(node, Verdict.HEALTHY, "back in service in Slurm", {}, None, "returned", now)
            )

    def _quarantined(self) -> dict[str, Quarantine]:
        q = self.settings.quarantine
        now = self.clock.now()
        faults = self.store.node_faults(now - q.window_s - q.max_s)
        return quarantined(faults, self.store.quarantine_clears(), now, q)

    # ------------------------------------------------------------------ records

    def _apply_records(self, records: tuple[Any, ...]) -> None:
        if not records:
            return
        now = self.clock.now()
        with self.store.transaction():
            for rec in records:
                self._apply_record(rec, now)

    def _apply_record(self, rec: Any, now: float) -> None:
        s = self.store
        if isinstance(rec, Event):
            if s.record_event(rec):
                log.info("logbook", kind=rec.kind.value, message=rec.message)
        elif isinstance(rec, SetState):
            current = s.get_run(rec.run)
            if current is not None and current.state is not rec.state:
                s.set_state(rec.run, rec.state, now, rec.reason, rec.spend_restart)
        elif isinstance(rec, AttemptStarted):
            s.attempt_started(rec.run, rec.seq, rec.nodes, rec.at)
        elif isinstance(rec, AttemptEnded):
            s.attempt_ended(rec.run, rec.seq, rec.at, rec.end_state, rec.reason, rec.exit_code)
        elif isinstance(rec, AttemptRequeued):
            s.add_attempt(rec.run, rec.job_id, rec.restart_count, rec.at, rec.excluded)
        elif isinstance(rec, Exclude):
            s.exclude(rec.run, rec.node, rec.reason, now)
        elif isinstance(rec, Defer):
            s.defer(rec.run, rec.node, rec.reason, now)
        elif isinstance(rec, Unexclude):
            s.unexclude(rec.run, rec.node)
        elif isinstance(rec, NodeVerdict):
            s.set_verdict(rec)
        elif isinstance(rec, Fault):
            s.record_node_fault(rec)
        else:  # pragma: no cover - a new record type without a handler is a programming error
            raise TypeError(f"no handler for record {rec!r}")

    # ------------------------------------------------------------------ actions

    def _execute(self, run: RunRecord, action: Action, snap: ClusterSnapshot) -> None:
        if isinstance(action, Submit) and self.checkpoints is not None:
            # Chosen before the intent is journaled: a retried submission hands the same checkpoint.
            action = replace(action, resume=self.checkpoints.resume_for(run, self.store))
        params = params_of(action)
        if isinstance(action, Fence) and self.store.action_done(run.name, action.kind, params):
            return
        self._crash("before_intent", action.kind)
        intent = self.store.begin_action(run.name, action.kind, params, self.clock.now())
        log.info("intent", intent=intent, action=action.kind.value, **_loggable(params))
        self._crash("after_intent", action.kind)
        self._perform_and_complete(run, intent, action)

    def _perform_and_complete(self, run: RunRecord, intent: int, action: Action) -> None:
        try:
            outcome = self._perform(run, intent, action)
        except PermissionDenied as exc:
            self._fail(run, intent, action, exc)
            if isinstance(action, ChangeNode):
                self._node_rights = False
            return
        except TransientError:
            raise  # the intent stays open; the next tick settles it against Slurm
        except PermanentError as exc:
            self._fail(run, intent, action, exc)
            return
        self._crash("after_execute", action.kind)
        self._complete(run, intent, action, outcome)
        self._crash("after_complete", action.kind)

    def _perform(self, run: RunRecord, intent: int, action: Action) -> dict[str, Any]:
        sched = self.scheduler
        if isinstance(action, Submit):
            seq = (run.attempt.seq + 1) if run.attempt else 0
            tag = submit_tag(run.name, self.store.instance_id, intent)
            url = self.settings.ingest_url
            token = self.store.run_token(run.name) if url else None
            job_id = sched.submit(submit_request(run.spec, action, tag, seq, token=token, ingest_url=url))
            return {"job_id": job_id}
        if isinstance(action, Cancel):
            sched.cancel(action.job_id)
        elif isinstance(action, ChangeNode):
            sched.set_node_state(action.node, action.change, action.reason)
        elif isinstance(action, SetExcluded):
            sched.set_excluded(action.job_id, action.nodes)
        elif isinstance(action, Release):
            sched.release(action.job_id)
        elif isinstance(action, Fence):
            assert self.fencer is not None
            self.fencer.fence(action.node)
        return {}

    def _complete(self, run: RunRecord, intent: int, action: Action, outcome: Mapping[str, Any]) -> None:
        now = self.clock.now()
        with self.store.transaction():
            self.store.complete_action(intent, "done", outcome, now)
            self._after(run, intent, action, outcome, now)

    def _after(self, run: RunRecord, intent: int, action: Action, outcome: Mapping[str, Any], now: float) -> None:
        s, a = self.store, run.attempt
        seq, job = (a.seq, a.job_id) if a else (None, None)
        if isinstance(action, Submit):
            new = s.add_attempt(run.name, int(outcome["job_id"]), 0, now, action.exclude)
            s.set_state(run.name, RunState.QUEUED, now, spend_restart=action.restart)
            s.rollbacks_done(run.name, new.seq)  # the new attempt carries out any planned rollback
            if action.resume is not None:
                s.record_resume_plan(run.name, new.seq, action.resume)
            kind = EventKind.RESTARTED if action.restart else EventKind.SUBMITTED
            verb = "restarted as" if action.restart else "submitted as"
            excl = f", excluding {','.join(action.exclude)}" if action.exclude else ""
            resume = f"; {describe_plan(action.resume)}" if action.resume is not None else ""
            evidence: dict[str, Any] = {
                "exclude": list(action.exclude),
                "reason": action.reason,
                "restarts_spent": run.restarts_spent + int(action.restart),
            }
            if action.resume is not None:  # the plan as JSON, for the logbook, chronicle and goodput readers
                evidence["resume"] = action.resume.to_json()
                evidence["resume_step"] = action.resume.step
            if self.progress is not None and a is not None:  # what the replaced attempt had reached
                evidence["last_step"] = a.last_step
                evidence["step_time_s"] = a.step_time_s
            s.record_event(
                Event(
                    run.name,
                    kind,
                    f"{new.label}: {verb} job {new.job_id}{excl} ({action.reason}){resume}",
                    f"{run.name}:{new.seq}:{kind.value}:",
                    now,
                    new.seq,
                    new.job_id,
                    evidence=evidence,
                )
            )
        elif isinstance(action, ChangeNode):
            s.set_node_action(action.node, "drained" if action.change is NodeChange.DRAIN else "down", now)
            if action.change in (NodeChange.DOWN, NodeChange.DRAIN):  # what the blast radius counts
                s.record_node_change(
                    NodeChangeRecord(action.node, run.name, action.change.value, now, action.reason, intent)
                )
            if action.change is NodeChange.DRAIN:
                s.record_event(
                    Event(
                        run.name,
                        EventKind.NODE_DRAINED,
                        f"{action.node} downed and drained in Slurm: {action.reason}",
                        f"{run.name}:node_drained:{action.node}",
                        now,
                        seq,
                        job,
                        evidence={"node": action.node, "reason": action.reason},
                    )
                )
        elif isinstance(action, Cancel) and run.state is RunState.RECOVERING:
            s.record_event(
                Event(
                    run.name,
                    EventKind.STOPPED,
                    f"stopped job {action.job_id}: {action.reason}",
                    f"{run.name}:{seq}:stopped:{action.job_id}",
                    now,
                    seq,
                    job,
                )
            )
        elif isinstance(action, Release):
            s.record_event(
                Event(
                    run.name,
                    EventKind.RELEASED,
                    f"released job {action.job_id}: {action.reason}",
                    f"{run.name}:{seq}:released:{now:.3f}",
                    now,
                    seq,
                    job,
                )
            )
        elif isinstance(action, Fence):
            s.record_event(
                Event(
                    run.name,
                    EventKind.FENCED,
                    f"fenced {action.node} (site fence command)",
                    f"{run.name}:{seq}:fenced:{action.node}",
                    now,
                    seq,
                    job,
                )
            )

    def _fail(self, run: RunRecord, intent: int, action: Action, exc: PortError) -> None:
        now = self.clock.now()
        a = run.attempt
        log.warning("action_failed", action=action.kind.value, error=str(exc))
        with self.store.transaction():
            self.store.complete_action(intent, "failed", {"error": str(exc)}, now)
            kind = EventKind.NODE_EXCLUDED if isinstance(action, ChangeNode) else EventKind.WARNING
            what = f"could not {action.kind.value.replace('_', ' ')}"
            if isinstance(action, ChangeNode):
                what = f"{action.node} excluded from the run; could not set it {action.change.value}"
            self.store.record_event(
                Event(
                    run.name,
                    kind,
                    f"{what}: {exc}",
                    f"{run.name}:failed-intent:{intent}",
                    now,
                    a.seq if a else None,
                    a.job_id if a else None,
                    evidence=params_of(action),
                )
            )

    # ------------------------------------------------------------------ crash recovery

    def _settle_open_intents(self, snap: ClusterSnapshot, result: TickResult) -> set[str]:
        """Complete intents a previous daemon left open. Returns runs still waiting on one."""
        blocked: set[str] = set()
        for intent in self.store.open_actions():
            run = self.store.get_run(intent["run"])
            if run is None:
                continue
            action = action_from(intent["kind"], intent["params"])
            tag = submit_tag(run.name, self.store.instance_id, intent["id"])
            outcome = effect_present(intent["kind"], tag, intent["params"], snap)
            if outcome is not None:
                log.info("intent_settled", intent=intent["id"], action=intent["kind"], outcome=outcome)
                self._complete(run, intent["id"], action, outcome)
                continue
            log.info("intent_retried", intent=intent["id"], action=intent["kind"])
            blocked.add(run.name)  # this tick's snapshot predates the retried action: decide next tick
            try:
                self._perform_and_complete(run, intent["id"], action)
                result.acted = True
            except TransientError:
                pass
        return blocked


OUT_OF_SERVICE = ("drained", "down", "held-by-slurm")  # verdict actions of a node seen out of service


def _acted_on(snap: ClusterSnapshot, node: str) -> bool:
    """The supervisor drained or downed the node: the finding has done its work. When an operator
    returns the node to service, an old finding must not fault the next run that lands there (the
    bad-node memory remembers repeat offenders)."""
    info = snap.nodes.get(node)
    return info is not None and info.reason.startswith(REASON_PREFIX) and (info.drained or info.down)


def _loggable(params: Mapping[str, Any]) -> dict[str, Any]:
    return {f"p_{k}": v for k, v in params.items() if k != "run"}
