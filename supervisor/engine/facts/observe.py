"""Observe: one tick's facts, gathered from Slurm, the node probes, the training logs, the node
agents and the checkpoint storage — returned, never written.

``Observer.snapshot`` reads Slurm (jobs every tick — by id where the scheduler can, see
``job_reads`` — nodes when needed). ``Observer.gather`` turns
what changed into facts and the records they call for (spike decisions, slowdowns, the attempts'
progress, node verdicts and marks, checkpoint verifications' logbook lines); the engine's executor
applies those records. ``Observer.observation`` then builds the ``Observation`` the domain decides
on, reading back what is in the store (quarantine, pending rollbacks, verified checkpoints).

A health feed that judges which nodes a run may speak for (the daemon's ingest: ``NodeRoster``)
is told at every tick which nodes each active run's current job holds (``job_nodes``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

import structlog

from supervisor.domain.actions import AttemptLoadFailed, AttemptProgress, Record
from supervisor.domain.checkpoints.memory import describe_restore
from supervisor.domain.cluster import ClusterSnapshot, JobInfo, JobState, NodeInfo
from supervisor.domain.health.quarantine import Quarantine, QuarantineSettings, quarantined
from supervisor.domain.observation import Forgotten, Observation
from supervisor.domain.records import Event, EventKind, RunRecord, Verdict
from supervisor.domain.run import RunState
from supervisor.engine.facts.forgotten import ForgottenJobs
from supervisor.engine.facts.hang_stacks import HangStacks
from supervisor.engine.facts.job_reads import JobReadPlan, plan_job_read
from supervisor.engine.facts.nodes import NodeFacts, NodeWatch, focus_nodes, running_nodes
from supervisor.engine.facts.probes import ProbeTracker
from supervisor.engine.watch.checkpoints import CheckpointWatch
from supervisor.engine.watch.nulls import NoCheckpoints, NoProgress
from supervisor.engine.watch.pace import imbalance_events
from supervisor.engine.watch.progress import ProgressWatch
from supervisor.engine.watch.spikes import pending_rollbacks, spike_records
from supervisor.ports import Accounting, Clock, NodeGuard, PortError, Scheduler, Store

log = structlog.get_logger("supervisor.engine")

Watched = tuple[set[str], set[str]]  # nodes under watch (not healthy), nodes open intents name


@dataclass(frozen=True)
class Facts:
    """What one tick saw, before anything is decided."""

    records: tuple[Record, ...]  # what is to be remembered: the executor applies them first
    dead: Mapping[str, str]  # node -> evidence that it is dead (probes, silent agents)
    hangs: Mapping[str, Mapping[str, Any]]  # run -> hang evidence
    nodes: NodeFacts  # findings, returned nodes, reporting agents


@runtime_checkable
class NodeRoster(Protocol):
    """Told each tick which nodes each supervised run's current job holds (a run absent has ended)."""

    def publish_job_nodes(self, held: Mapping[str, frozenset[str]]) -> None: ...


@runtime_checkable
class JobScopedScheduler(Protocol):
    """A scheduler that reads named jobs for less than the account's whole list (the Slurm CLI)."""

    def snapshot_of(self, jobs: Collection[int] | None, include_nodes: bool | Collection[str]) -> ClusterSnapshot:
        """As ``Scheduler.snapshot``, holding (at least) the jobs named that Slurm still holds;
        None: every job of the account."""
        ...


def job_nodes(runs: Iterable[RunRecord], snap: ClusterSnapshot) -> dict[str, frozenset[str]]:
    """Per run: the nodes of its current job — those squeue shows, and those its attempt started
    on (a job that just ended still speaks for them: the XID that killed it is often reported after)."""
    held: dict[str, frozenset[str]] = {}
    for run in runs:
        a = run.attempt
        job = snap.jobs.get(a.job_id) if a is not None else None
        held[run.name] = frozenset((a.nodes if a is not None else ()) + (job.nodes if job is not None else ()))
    return held


class Observer:
    def __init__(
        self,
        *,
        scheduler: Scheduler,
        store: Store,
        clock: Clock,
        probes: ProbeTracker,
        progress: ProgressWatch | NoProgress,
        checkpoints: CheckpointWatch | NoCheckpoints,
        nodes: NodeWatch,
        quarantine: QuarantineSettings,
        node_refresh_ticks: int,
        accounting: Accounting | None = None,
        guard: NodeGuard | None = None,
        roster: NodeRoster | None = None,
        whole_cluster_s: tuple[float, float] = (15.0, 60.0),
        account: str = "",
        stacks: HangStacks | None = None,
    ) -> None:
        self.scheduler, self.store, self.clock = scheduler, store, clock
        self.account = account  # who the instance is: the node reasons it recognises as its own name it
        self.stacks = stacks  # a hang's stacks, captured before the decision to cancel (issue 35)
        self.roster = roster  # told each tick which nodes each run's job holds (the ingest)
        self.forgotten = ForgottenJobs(accounting)  # jobs squeue no longer lists, read from sacct
        self._forgotten: dict[int, Forgotten] = {}
        self.probes, self.progress, self.checkpoints, self.nodes = probes, progress, checkpoints, nodes
        self.quarantine = quarantine
        self.guard = guard  # the node guard's shared quarantine, when a site runs one
        self.node_refresh_ticks = max(1, node_refresh_ticks)
        self.whole_min_s, self.whole_max_s = whole_cluster_s
        self._nodes: Mapping[str, NodeInfo] | None = None  # every node: the last whole read + newer focus reads
        self._whole_at = float("-inf")  # when the whole node table was last read
        self._jobs: Mapping[int, JobInfo] = {}  # the last snapshot's jobs (what the next focus starts from)
        self._by_id = scheduler if isinstance(scheduler, JobScopedScheduler) else None
        self._account_at: float | None = None  # when the account's whole job list was last read
        self._ticks = 0

    # ------------------------------------------------------------------ Slurm

    def snapshot(self, nodes_needed: bool, cluster_needed: bool = False) -> ClusterSnapshot:
        """Jobs every tick: the runs' and open intents' jobs by id, the account's whole list when
        ``job_reads`` says so (a scheduler without reads by id: its snapshot). Nodes when ``nodes_needed``, every ``node_refresh_ticks``-th tick, or
        when a job of ours started or ended since (its decision reads its nodes' state) — and then
        only the nodes in focus (``focus_nodes``: our jobs', spares, nodes under watch), merged into
        the last whole read. The whole table is read when ``cluster_needed`` (a run is being placed)
        at most every ``whole_min_s``, and at least every ``whole_max_s`` (Slurm's hook drains and
        the partitions' idle nodes elsewhere). Jobs of ours squeue no longer lists come from
        accounting (``ForgottenJobs``)."""
        self._ticks += 1
        runs = self.store.runs(active_only=True)
        fresh = nodes_needed or self._nodes is None or self._ticks % self.node_refresh_ticks == 0
        watched = self._watched()  # read once: the snapshot writes nothing to the store
        scope = self._scope(runs, fresh, cluster_needed, watched)
        snap = self._merged(self._read_jobs(runs, scope), scope)
        again = self._unread(runs, snap, scope, watched)
        if again:
            snap = self._merged(self._read_nodes(snap, again), again)
        self._jobs = snap.jobs
        snap, self._forgotten = self.forgotten.look_up(runs, snap)
        return snap

    def _read_jobs(self, runs: list[RunRecord], scope: bool | frozenset[str]) -> ClusterSnapshot:
        """Jobs by id, or the account's list when ``job_reads`` says so; ``scope``'s nodes."""
        if self._by_id is None:
            return self.scheduler.snapshot(include_nodes=scope)
        now = self.clock.now()
        age = None if self._account_at is None else now - self._account_at
        plan: JobReadPlan = plan_job_read(
            runs, self.store.open_actions(), account_age_s=age, every_s=self.whole_max_s, busy=scope is True
        )
        snap = self._by_id.snapshot_of(plan.ids, scope)
        if plan.ids is None:
            self._account_at = now
            log.debug("jobs_read_whole_account", reason=plan.reason, jobs=len(snap.jobs))
        return snap

    def _read_nodes(self, snap: ClusterSnapshot, nodes: frozenset[str]) -> ClusterSnapshot:
        """``nodes`` read once more, with this tick's jobs (read again only where they cannot be left out)."""
        if self._by_id is None:
            return self.scheduler.snapshot(include_nodes=nodes)
        return replace(self._by_id.snapshot_of(frozenset(), nodes), jobs=snap.jobs)

    def _scope(
        self, runs: list[RunRecord], fresh: bool, cluster_needed: bool, watched: Watched
    ) -> bool | frozenset[str]:
        """What to read of the nodes: all (True), those in focus (a set), or none (False)."""
        age = self.clock.now() - self._whole_at
        if self._nodes is None or (fresh and (age >= self.whole_max_s or (cluster_needed and age >= self.whole_min_s))):
            return True
        return self._focus(runs, self._jobs, watched) or False if fresh else False

    def _unread(
        self, runs: list[RunRecord], snap: ClusterSnapshot, scope: bool | frozenset[str], watched: Watched
    ) -> frozenset[str]:
        """Nodes to read once more: a job of ours moved since the nodes were last read (maybe onto a
        node that came back since: stale info would call it down), or holds nodes not read; after a
        whole read (grouped: no addresses), those in focus whose address is not known yet (the
        probe connects to it). ``snap``: merged with what was read before."""
        focus = self._focus(runs, snap.jobs, watched)
        if scope is True:
            return frozenset(n for n in focus if (info := snap.nodes.get(n)) is not None and not info.address)
        if scope is False:
            return focus if self._a_job_moved(runs, snap) else frozenset()
        return focus if focus - scope else frozenset()

    def _watched(self) -> Watched:
        """Nodes under watch (a verdict other than healthy), and those an open intent names."""
        watched = {v.node for v in self.store.verdicts() if v.verdict is not Verdict.HEALTHY}
        intents = {str(i.params["node"]) for i in self.store.open_actions() if "node" in i.params}
        return watched, intents

    def _focus(self, runs: list[RunRecord], jobs: Mapping[int, JobInfo], watched: Watched) -> frozenset[str]:
        under_watch, intents = watched
        return focus_nodes(runs, jobs) | under_watch | intents | self.nodes.finding_nodes

    def _merged(self, snap: ClusterSnapshot, scope: bool | frozenset[str]) -> ClusterSnapshot:
        if scope is True:
            self._nodes, self._whole_at = with_addresses(snap.nodes, self._nodes or {}), self.clock.now()
        elif scope:
            self._nodes = {**(self._nodes or {}), **snap.nodes}  # a new mapping: snapshots stay as taken
        return ClusterSnapshot(snap.taken_at, snap.jobs, self._nodes or {})

    def _a_job_moved(self, runs: list[RunRecord], snap: ClusterSnapshot) -> bool:
        """A job of ours ended, or started since it was last seen."""
        for run in runs:
            a = run.attempt
            if a is not None and a.ended_at is None:
                job = snap.jobs.get(a.job_id)
                if job is None or job.state.finished or (a.started_at is None and job.state is not JobState.PENDING):
                    return True
        return False

    # ------------------------------------------------------------------ facts

    def gather(self, runs: list[RunRecord], snap: ClusterSnapshot) -> Facts:
        now = self.clock.now()
        if self.roster is not None:
            self.roster.publish_job_nodes(job_nodes(runs, snap))
        dead = self.probes.update(running_nodes(runs, snap), snap, now)
        hangs: Mapping[str, Mapping[str, Any]] = self.progress.update(runs, snap, now)
        if self.stacks is not None:
            hangs = self.stacks.examine(runs, snap, hangs)
        progress = _progress_records(runs, self.progress)
        runs = _with_progress(runs, progress)
        watch = self.checkpoints
        records: list[Record] = [*progress, *_load_failures(runs, self.progress)]
        records += spike_records(
            self.progress.take_notices(), runs, self.store, self.clock, lambda r: watch.refresh(r, self.store)
        )
        records += _slowdown_events(runs, self.progress, now)
        records += imbalance_events(runs, self.progress.take_imbalances(), now)
        records += _memory_restores(runs, self.progress, now)
        self.checkpoints.update(runs, self.store)  # writes what it finds through the executor
        nodes = self.nodes.observe(runs, snap, self.store, self.progress.take_findings(), now)
        records += nodes.records
        return Facts(tuple(records), {**nodes.stale, **dead}, hangs, nodes)

    def observation(self, runs: list[RunRecord], snap: ClusterSnapshot, facts: Facts) -> Observation:
        """What the domain decides on: this tick's facts and what the store holds (read after the
        facts' records were applied)."""
        checkpoint_at = self.checkpoints.verified_at([r for r in runs if r.deferred], self.store)
        saves = self.checkpoints.saved_now(_just_ended(runs, snap), self.store)
        return Observation(
            snapshot=snap,
            dead=facts.dead,
            dead_since=self.probes.first_failures(facts.dead),
            hangs=facts.hangs,
            findings=facts.nodes.findings,
            quarantined=self._quarantined(),
            checkpoint_at=checkpoint_at,
            rollbacks=pending_rollbacks(runs, self.store),
            returned=facts.nodes.returned,
            agents=facts.nodes.agents,
            history={r.name: tuple(self.store.attempts(r.name, _history_depth(r))) for r in runs},
            refused={r.name: tuple(self.store.refused_submissions(r.name, _since_current(r))) for r in runs},
            forgotten=self._forgotten,
            saved=saves.saved,
            unchecked=saves.unchecked,
            account=self.account,
        )

    def _quarantined(self) -> dict[str, Quarantine]:
        q = self.quarantine
        now = self.clock.now()
        faults = self.store.node_faults(now - q.window_s - q.max_s)
        return {**self._shared_quarantine(), **quarantined(faults, self.store.quarantine_clears(), now, q)}

    def _shared_quarantine(self) -> Mapping[str, Quarantine]:
        """The node guard's quarantine (every instance's faults); none while it does not answer."""
        if self.guard is None:
            return {}
        try:
            return self.guard.quarantined()
        except PortError as exc:
            log.warning("guard_quarantine_unavailable", error=str(exc))
            return {}


def with_addresses(read: Mapping[str, NodeInfo], before: Mapping[str, NodeInfo]) -> Mapping[str, NodeInfo]:
    """A whole-table read keeps what earlier reads of the nodes in focus gave and it lacks (a node's
    address and port are its configuration): the formatted read groups nodes (neither), the 24.11+
    JSON of a group names addresses but no port. Without the port the probe would not probe the
    node; a guessed 6818 called a healthy slurmd listening elsewhere unreachable."""
    kept = {name: merged for name, info in read.items() if (merged := _kept(info, before.get(name))) is not info}
    return {**read, **kept} if kept else read


def _kept(info: NodeInfo, old: NodeInfo | None) -> NodeInfo:
    """``info`` with ``old``'s address and port where it has neither, or ``old``'s port where it
    has the same address and no port; else ``info`` itself."""
    if old is None or not old.address:
        return info
    if not info.address:
        return replace(info, address=old.address, port=old.port)
    if info.port is None and old.port is not None and info.address == old.address:
        return replace(info, port=old.port)
    return info


def _progress_records(runs: list[RunRecord], progress: ProgressWatch | NoProgress) -> list[AttemptProgress]:
    """Each current attempt's newest logged step and step time, to remember: decisions that read
    them (did a resumed checkpoint load?) make the same choice after a daemon restart."""
    out = []
    for run in runs:
        a = run.attempt
        step = progress.last_step(a.job_id, a.restart_count) if a is not None else None
        if a is not None and step is not None and step != a.last_step:
            key = (a.job_id, a.restart_count)
            pace, save = progress.hang_pace(*key), progress.save_s(*key)
            out.append(AttemptProgress(run.name, a.seq, step, progress.step_time(*key), pace, save))
    return out


def _load_failures(runs: list[RunRecord], progress: ProgressWatch | NoProgress) -> list[AttemptLoadFailed]:
    """Each current attempt's log evidence of a failed checkpoint load, new since the last tick."""
    out = []
    for a in (run.attempt for run in runs):
        if a is None:
            continue
        why = progress.load_failure(a.job_id, a.restart_count)
        if why is not None and why != a.load_failed:
            out.append(AttemptLoadFailed(a.run, a.seq, why))
        early = progress.failed_before_load(a.job_id, a.restart_count)
        if early is not None and early != a.failed_before_load:
            out.append(AttemptLoadFailed(a.run, a.seq, early, before_load=True))
    return out


def _with_progress(runs: list[RunRecord], progress: list[AttemptProgress]) -> list[RunRecord]:
    by_run = {p.run: p for p in progress}
    out = []
    for run in runs:
        p, a = by_run.get(run.name), run.attempt
        if p is not None and a is not None:
            pace = p.step_time_s or a.step_time_s
            run = replace(run, attempt=replace(a, last_step=p.last_step, step_time_s=pace))
        out.append(run)
    return out


def _slowdown_events(runs: list[RunRecord], progress: ProgressWatch | NoProgress, now: float) -> list[Record]:
    by_name = {r.name: r for r in runs}
    out: list[Record] = []
    for name, key, evidence in progress.take_slowdowns():
        run = by_name.get(name)
        a = run.attempt if run else None
        if a is None or (a.job_id, a.restart_count) != key:
            continue
        blame = evidence.get("stragglers") or {}
        linked = f"; explained by straggler {', '.join(sorted(blame))}" if blame else "; no straggler named"
        message = f"{a.label}: slowdown: {evidence['reason']}{linked}"
        key_ = f"{name}:{a.seq}:slowdown"
        out.append(Event(name, EventKind.SLOWDOWN, message, key_, now, a.seq, a.job_id, evidence=evidence))
    return out


def _memory_restores(runs: list[RunRecord], progress: ProgressWatch | NoProgress, now: float) -> list[Record]:
    """A relaunched step's restore from peer copies: one logbook note each (keyed by the
    generation: a restarted daemon reads the log again and writes nothing twice)."""
    by_name = {r.name: r for r in runs}
    out: list[Record] = []
    for name, key, restore in progress.take_restores():
        run = by_name.get(name)
        a = run.attempt if run else None
        if a is None or (a.job_id, a.restart_count) != key:
            continue
        gen, goal = restore.generation, run.step.goal if run and run.step else None
        evidence = {"in_allocation": "memory_restored", "generation": goal.generation if goal else 0,
                    "resume_step": gen.step, "memory_restore": {**gen.to_json(), "offered_step": restore.offered_step,
                    "seconds": restore.seconds, "moved_bytes": restore.moved_bytes}}  # fmt: skip
        message = f"{a.label}: {describe_restore(restore)}"
        out.append(Event(name, EventKind.NOTE, message, f"{name}:{a.seq}:memory-restored:{gen.step}", now, a.seq,
                         a.job_id, evidence=evidence))  # fmt: skip
    return out


def _history_depth(run: RunRecord) -> int:
    """Attempts a decision looks back on: a crash loop's, and a chain of continuations' bound."""
    chain = run.spec.continuation.max_without_progress if run.spec.continuation is not None else 0
    return max(run.spec.pacing.crash_loop_after, chain) + 1


def _just_ended(runs: list[RunRecord], snap: ClusterSnapshot) -> list[RunRecord]:
    """Runs whose job ended by itself, or Slurm requeued, and is not decided on yet: a planned end
    (a preemption's requeue too) is judged on the newest verified checkpoint (domain.decide.continuation)."""
    out = []
    for run in runs:
        job = snap.jobs.get(run.attempt.job_id) if run.attempt is not None else None
        requeued = job is not None and run.attempt is not None and job.restart_count > run.attempt.restart_count
        if job is not None and (job.state.finished or requeued) and run.state in (RunState.RUNNING, RunState.QUEUED):
            out.append(run)
    return out


def _since_current(run: RunRecord) -> float:
    """Since when refusals count: the current attempt's submission (a refusal of its successor
    comes after it), or the run's registration."""
    return run.attempt.submitted_at if run.attempt is not None else run.created_at
