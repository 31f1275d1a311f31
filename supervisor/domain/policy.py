"""The supervisor's decisions for one run on one snapshot. Pure: no I/O, no clock, no logging.

``decide(run, observation, policy)`` looks at the run's record and what Slurm (and the direct node
probes) show now, and returns the records to write and the actions to take. The engine executes
them; the next tick sees their effect. Every branch is idempotent: deciding twice on the same
inputs asks for nothing that already took effect.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

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
    Record,
    Release,
    SetExcluded,
    SetState,
    Submit,
    Unexclude,
)
from supervisor.domain.cluster import ClusterSnapshot, JobHold, JobInfo, JobState, NodeChange
from supervisor.domain.health import NodeFinding, Severity
from supervisor.domain.lemon import Fault, Quarantine
from supervisor.domain.placement import place, placement_notes
from supervisor.domain.records import AttemptRecord, Event, EventKind, NodeVerdict, RunRecord, Verdict
from supervisor.domain.rollback import RollbackRecord
from supervisor.domain.run import RestartMode, RunState

REASON_PREFIX = "slurm-supervisor"


@dataclass(frozen=True)
class Observation:
    """One tick's view: Slurm's snapshot plus nodes that direct probes confirmed dead."""

    snapshot: ClusterSnapshot
    dead: Mapping[str, str] = field(default_factory=dict)  # node -> evidence
    hangs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # run -> hang evidence
    findings: Mapping[str, NodeFinding] = field(default_factory=dict)  # node -> worst active finding
    quarantined: Mapping[str, Quarantine] = field(default_factory=dict)  # nodes every run keeps out
    checkpoint_at: Mapping[str, float] = field(default_factory=dict)  # run -> newest verified checkpoint
    rollbacks: Mapping[str, RollbackRecord] = field(default_factory=dict)  # run -> rollback planned, not yet done
    # nodes kept out of a run that Slurm took out of service (we, a health check or an admin) and
    # someone returned to service since
    returned: frozenset[str] = frozenset()
    agents: frozenset[str] = frozenset()  # nodes whose node agent reports (fresh heartbeat)

    @property
    def now(self) -> float:
        return self.snapshot.taken_at


@dataclass(frozen=True)
class Policy:
    may_change_nodes: bool = True
    drains_left: int = 8  # blast radius left in the current window
    fence: bool = False  # a site fence command is configured
    evidence_wait_s: float = 0.0  # after an unexplained job death, wait this long for node agents' evidence
    stuck_page_s: float = 1800.0  # a run that cannot be placed pages after waiting this long
    when_short: str = "use-least-bad"  # [quarantine] when_short: quarantined nodes for a run short of nodes


def node_reason(run: str, why: str) -> str:
    return f"{REASON_PREFIX}: run {run}: {why}"[:200]


def decide(run: RunRecord, obs: Observation, policy: Policy) -> Decision:
    decision = _returned(run, obs) + _decide(_without_returned(run, obs), obs, policy)
    drains = _finish_drains(run, obs)
    if not drains:
        return decision
    actions = drains + tuple(a for a in decision.actions if a not in drains)
    return replace(decision, actions=actions)


def _returned(run: RunRecord, obs: Observation) -> Decision:
    """Nodes this run keeps out that an operator (or a repair) returned to service: usable again at
    once — a pending job's exclude list drops them this tick. Repeat offenders stay out through
    the bad-node memory."""
    if run.state.terminal:
        return Decision()
    records: list[Record] = []
    kept_out = {**{n: why for n, (_, why) in run.deferred.items()}, **run.excluded}
    for node in sorted(set(kept_out) & obs.returned):
        held = obs.quarantined.get(node)
        quarantine = f"; still quarantined: {held.reason}" if held is not None else ""
        records += [
            Unexclude(run.name, node),
            _event(
                run,
                run.attempt,
                EventKind.NODE_RETURNED,
                f"{node} is back in service in Slurm; the run may use it again{quarantine}",
                obs,
                {"node": node, "was": kept_out[node]},
                f"{node}:{obs.now:.0f}",
            ),
        ]
    return Decision(tuple(records))


def _without_returned(run: RunRecord, obs: Observation) -> RunRecord:
    """The run as this tick decides on it: returned nodes no longer kept out (their Unexclude is
    in the same decision), so a job Slurm already started on one is not taken for a fault."""
    if not obs.returned or not (set(run.excluded) | set(run.deferred)) & obs.returned:
        return run
    excluded = {n: why for n, why in run.excluded.items() if n not in obs.returned}
    deferred = {n: v for n, v in run.deferred.items() if n not in obs.returned}
    return replace(run, excluded=excluded, deferred=deferred)


def _finish_drains(run: RunRecord, obs: Observation) -> tuple[ChangeNode, ...]:
    """Nodes this run downed but did not get to drain (a crash between the two): drain them now."""
    if run.state.terminal:
        return ()
    out = []
    for name in sorted(run.excluded):
        info = obs.snapshot.nodes.get(name)
        if info is not None and info.down and not info.drained and _marked_by_us(info.reason, run.name):
            out.append(ChangeNode(run.name, name, NodeChange.DRAIN, info.reason))
    return tuple(out)


def _decide(run: RunRecord, obs: Observation, policy: Policy) -> Decision:
    if run.state.terminal:
        return Decision()
    attempt = run.attempt
    if attempt is None:
        if run.cancel_requested:
            return _set_terminal(run, RunState.CANCELLED, EventKind.CANCELLED, "cancelled before any job ran", obs)
        return _submit(run, None, obs, policy, restart=False, reason="first submission", since=run.created_at)
    job = obs.snapshot.jobs.get(attempt.job_id)
    if run.cancel_requested:
        return _cancel(run, attempt, job, obs)
    if job is None:
        return _vanished(run, attempt, obs, policy)
    if job.restart_count > attempt.restart_count:
        return _requeued_by_slurm(run, attempt, job, obs, policy)
    if job.state is JobState.PENDING:
        return _pending(run, attempt, job, obs, policy)
    if job.state in (JobState.RUNNING, JobState.SUSPENDED):
        return _running(run, attempt, job, obs, policy)
    if job.state.finished and not job.completing:
        return _finished(run, attempt, job, obs, policy)
    if run.state is RunState.RECOVERING and _only_fenced_nodes_left(run, job, obs):
        return _finished(run, attempt, job, obs, policy)
    return Decision()  # COMPLETING or an unknown state: wait for the next snapshot


def _only_fenced_nodes_left(run: RunRecord, job: JobInfo, obs: Observation) -> bool:
    """Slurm is still completing the job, but only on nodes this run downed: nothing of the old
    incarnation can run anywhere else, and those nodes take no new job (a hung slurmd keeps a job
    COMPLETING for tens of seconds while slurmctld's RPCs to it time out)."""
    if not job.completing or not job.nodes:
        return False
    for name in job.nodes:
        info = obs.snapshot.nodes.get(name)
        if name not in run.excluded or info is None or not info.down or not _marked_by_us(info.reason, run.name):
            return False
    return True


# ---------------------------------------------------------------- running and faults


def faulty_nodes(run: RunRecord, nodes: tuple[str, ...], obs: Observation) -> dict[str, str]:
    """Nodes among ``nodes`` that are dead or must not host this run, with the evidence."""
    bad: dict[str, str] = {}
    for name in nodes:
        info = obs.snapshot.nodes.get(name)
        if name in obs.dead:
            bad[name] = obs.dead[name]
        elif info is None:
            bad[name] = "node unknown to Slurm"
        elif info.down:
            bad[name] = f"Slurm reports the node DOWN ({info.reason or 'no reason'})"
        elif not info.responding:
            bad[name] = "Slurm reports the node NOT_RESPONDING"
        elif (found := obs.findings.get(name)) is not None and found.severity is Severity.FATAL:
            bad[name] = f"{found.reason} [{found.source}, rule {found.rule}]"
        elif name in run.excluded:
            bad[name] = f"node is kept out of this run: {run.excluded[name]}"
    return bad


def _running(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation, policy: Policy) -> Decision:
    records: list[Record] = []
    if a.started_at is None:
        records += [
            AttemptStarted(run.name, a.seq, job.nodes, job.start_time or obs.now),
            _event(
                run, a, EventKind.STARTED, f"{a.label} running on {_fmt(job.nodes)}", obs, {"nodes": list(job.nodes)}
            ),
        ]
        if run.state is not RunState.RECOVERING:
            records.append(SetState(run.name, RunState.RUNNING))
    bad = faulty_nodes(run, job.nodes, obs)
    if bad:
        return Decision(tuple(records)) + _recover(run, a, job, bad, obs, policy)
    if run.name in obs.rollbacks and run.state is not RunState.RECOVERING:
        why = f"rollback after the loss spike at step {obs.rollbacks[run.name].onset_step}"
        records.append(SetState(run.name, RunState.RECOVERING, reason=why))
        return Decision(tuple(records), (Cancel(run.name, job.job_id, why),))
    if run.name in obs.hangs and run.state is not RunState.RECOVERING:
        return Decision(tuple(records)) + _recover_hang(run, a, job, obs.hangs[run.name], obs)
    if run.state is RunState.RECOVERING:
        # A fault was recorded earlier; finish stopping this incarnation.
        return Decision(tuple(records), _stop(run, job, "finishing recovery started earlier"))
    records += _degraded(run, a, job, obs)
    return Decision(tuple(records)) + _at_checkpoint_boundary(run, a, job, obs, policy)


def _degraded(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation) -> list[Record]:
    """Degraded nodes of the job (throttling, a pending row remap): kept out from the next restart
    or checkpoint boundary on; the work since the last checkpoint is not thrown away for them."""
    out: list[Record] = []
    for node in job.nodes:
        found = obs.findings.get(node)
        if found is None or found.severity is not Severity.DEGRADED or node in run.deferred:
            continue
        evidence = {"node": node, "rule": found.rule, "source": found.source, **found.evidence}
        out += [
            Defer(run.name, node, found.reason),
            NodeVerdict(node, Verdict.SUSPECT, found.reason, evidence, run.name, "deferred", obs.now),
            _event(
                run,
                a,
                EventKind.NODE_DEGRADED,
                f"{node} degraded: {found.reason} [rule {found.rule}]; kept out from the next restart or "
                "checkpoint boundary",
                obs,
                evidence,
                f"{node}:{found.rule}",
            ),
        ]
    return out


def _at_checkpoint_boundary(
    run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation, policy: Policy
) -> Decision:
    """A verified checkpoint newer than both the attempt and a degraded node's finding: restart now
    without the node, losing (almost) no work, and drain it with the evidence."""
    ckpt = obs.checkpoint_at.get(run.name)
    nodes = sorted(n for n in job.nodes if n in run.deferred)
    if ckpt is None or not nodes or a.started_at is None:
        return Decision()
    if ckpt <= max([a.started_at] + [run.deferred[n][0] for n in nodes]):
        return Decision()
    why = f"checkpoint boundary: dropping degraded {_fmt(tuple(nodes))}"
    evidence = {"nodes": {n: run.deferred[n][1] for n in nodes}, "checkpoint_at": ckpt, "planned": True}
    records: list[Record] = [
        _event(
            run,
            a,
            EventKind.FAULT,
            f"{a.label}: {why} ({'; '.join(run.deferred[n][1] for n in nodes)})",
            obs,
            evidence,
            "boundary",
        ),
        SetState(run.name, RunState.RECOVERING, reason=why),
    ]
    actions: list[Action] = []
    drains_left = policy.drains_left
    for node in nodes:
        if policy.may_change_nodes and drains_left > 0 and not _marked_by_us(_reason_of(obs, node), run.name):
            actions.append(ChangeNode(run.name, node, NodeChange.DRAIN, node_reason(run.name, run.deferred[node][1])))
            drains_left -= 1
    return Decision(tuple(records), tuple(actions) + _stop(run, job, why))


def _reason_of(obs: Observation, node: str) -> str:
    info = obs.snapshot.nodes.get(node)
    return info.reason if info else ""


def _recover(
    run: RunRecord, a: AttemptRecord, job: JobInfo, bad: Mapping[str, str], obs: Observation, policy: Policy
) -> Decision:
    records, actions = _contain(run, a, bad, obs, policy)
    records.append(
        SetState(run.name, RunState.RECOVERING, reason="; ".join(f"{n}: {w}" for n, w in sorted(bad.items())))
    )
    actions += _stop(run, job, f"node fault on {_fmt(tuple(bad))}")
    return Decision(tuple(records), tuple(actions))


def _contain(
    run: RunRecord, a: AttemptRecord, bad: Mapping[str, str], obs: Observation, policy: Policy
) -> tuple[list[Record], list[Action]]:
    """Fault records for each bad node, and the node changes that keep it out of the cluster."""
    records: list[Record] = []
    actions: list[Action] = []
    drains_left = policy.drains_left
    held: list[str] = []
    for node, why in sorted(bad.items()):
        if policy.may_change_nodes and drains_left <= 0 and not _handled(run, node, obs):
            held.append(node)  # beyond the blast radius: suspect, neither drained nor kept out
            records.append(
                NodeVerdict(
                    node, Verdict.SUSPECT, why, {"node": node, "observed": why}, run.name, "blast-radius", obs.now
                )
            )
            continue
        records += _fault_records(run, a, node, why, obs)
        items, drains_left = _node_change(run, a, node, why, obs, policy, drains_left)
        actions += [x for x in items if isinstance(x, ChangeNode)]
        records += [x for x in items if not isinstance(x, ChangeNode)]
    if held:
        drained = sorted({x.node for x in actions if isinstance(x, ChangeNode)})
        msg = (
            f"mass fault: {len(bad)} nodes of {a.label} faulted at once; the blast-radius cap allowed "
            f"{len(drained)} drain(s) ({_fmt(tuple(drained))}); {len(held)} left suspect, not drained, "
            f"for a human to judge: {_fmt(tuple(held))}"
        )
        records.append(
            _event(
                run,
                a,
                EventKind.MASS_FAULT,
                msg,
                obs,
                {"faulted": dict(sorted(bad.items())), "drained": drained, "suspect": held},
                "mass",
            )
        )
    return records, actions


def _handled(run: RunRecord, node: str, obs: Observation) -> bool:
    """This run already downed or drained the node: no new node change is needed."""
    info = obs.snapshot.nodes.get(node)
    return info is not None and _marked_by_us(info.reason, run.name) and (info.down or info.drained)


def _recover_hang(
    run: RunRecord, a: AttemptRecord, job: JobInfo, hang: Mapping[str, Any], obs: Observation
) -> Decision:
    """The job runs but its log shows no progress: stop it and restart (no node is blamed)."""
    why = f"hang: {hang.get('reason', 'no progress')}"
    evidence = {**hang, "nodes": list(job.nodes)}
    records = (
        _event(run, a, EventKind.FAULT, f"{a.label}: {why}", obs, evidence, "hang"),
        SetState(run.name, RunState.RECOVERING, reason=why),
    )
    return Decision(records, (Cancel(run.name, job.job_id, "hang: no training progress"),))


def _fault_records(run: RunRecord, a: AttemptRecord, node: str, why: str, obs: Observation) -> list[Record]:
    info = obs.snapshot.nodes.get(node)
    evidence = {
        "node": node,
        "observed": why,
        "slurm_state": info.state.value if info else None,
        "slurm_flags": sorted(info.flags) if info else None,
        "slurm_reason": info.reason if info else None,
        "probe": obs.dead.get(node),
    }
    fault = _event(run, a, EventKind.FAULT, f"{a.label}: fault on {node}: {why}", obs, evidence, node)
    return [
        fault,
        Fault(node, obs.now, run.name, why, key=fault.key),  # what quarantine counts
        Exclude(run.name, node, why),
        NodeVerdict(node, Verdict.BAD, why, evidence, run.name, "excluded", obs.now),
    ]


def _node_change(
    run: RunRecord, a: AttemptRecord, node: str, why: str, obs: Observation, policy: Policy, drains_left: int
) -> tuple[list[ChangeNode | Event], int]:
    """DOWN (Slurm ends or requeues the job at once), then DRAIN (stays out until an admin resumes it)."""
    info = obs.snapshot.nodes.get(node)
    reason = node_reason(run.name, why)
    if info is not None and info.drained and info.responding and not _marked_by_us(info.reason, run.name):
        msg = f"{node} excluded from run {run.name}; already drained in Slurm ({info.reason or 'no reason'})"
        return [
            _event(
                run,
                a,
                EventKind.NODE_EXCLUDED,
                msg,
                obs,
                {"node": node, "slurm_reason": info.reason},
                f"{node}:drained",
            )
        ], drains_left
    if info is not None and _handled(run, node, obs):
        done = info.drained
        return ([] if done else [ChangeNode(run.name, node, NodeChange.DRAIN, info.reason)]), drains_left
    if not policy.may_change_nodes:
        msg = f"{node} excluded from run {run.name}; not drained: the supervisor has no node rights (may_change_nodes = false)"
        return [_event(run, a, EventKind.NODE_EXCLUDED, msg, obs, {"node": node}, f"{node}:norights")], drains_left
    if drains_left <= 0:
        msg = (
            f"{node} excluded from run {run.name}; not drained: blast-radius limit reached (daemon.max_drains_per_hour)"
        )
        return [_event(run, a, EventKind.NODE_EXCLUDED, msg, obs, {"node": node}, f"{node}:blast")], drains_left
    # A node the agent found faulty but that still answers is drained, not downed: its slurmd
    # cleans up the cancelled job. Requeue mode relies on DOWN to make Slurm requeue the job.
    alive = (
        node in obs.findings
        and node not in obs.dead
        and info is not None
        and info.responding
        and not info.down
        and run.spec.restart_mode is RestartMode.RESUBMIT
    )
    kinds = (NodeChange.DRAIN,) if alive else (NodeChange.DOWN, NodeChange.DRAIN)
    return [ChangeNode(run.name, node, c, reason) for c in kinds], drains_left - 1


def _marked_by_us(reason: str, run: str) -> bool:
    return reason.startswith(f"{REASON_PREFIX}: run {run}:")


def _stop(run: RunRecord, job: JobInfo, reason: str) -> tuple[Action, ...]:
    if run.spec.restart_mode is RestartMode.REQUEUE and job.state is not JobState.SUSPENDED:
        return ()  # Slurm requeues the job once its node is DOWN; nothing to cancel
    return (Cancel(run.name, job.job_id, reason),)


# ---------------------------------------------------------------- pending, requeued, finished


def _pending(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation, policy: Policy) -> Decision:
    """A queued job: its exclude list follows the nodes' state every tick (a node back in service
    is dropped from it, a node newly bad added), and a job that cannot be placed says why."""
    records: list[Record] = []
    actions: list[Action] = []
    if run.state in (RunState.REGISTERED, RunState.RUNNING, RunState.RECOVERING):
        records.append(SetState(run.name, RunState.QUEUED))
    placement = place(run, obs.snapshot, obs.quarantined, policy.when_short, current=job.excluded_nodes)
    if placement.submittable and set(placement.exclude) != set(job.excluded_nodes):
        actions.append(SetExcluded(run.name, job.job_id, placement.exclude))
    if job.hold is JobHold.LAUNCH_FAILED or _held_after_our_prolog(run, job):
        actions.append(Release(run.name, job.job_id, f"Slurm held the job after a launch failure ({job.state_reason})"))
    notes = placement_notes(run, a, placement, a.submitted_at, obs.now, policy.stuck_page_s)
    return Decision(tuple(records) + notes.events, tuple(actions), notes.recheck_at, waiting=placement.short)


def _submit(
    run: RunRecord,
    a: AttemptRecord | None,
    obs: Observation,
    policy: Policy,
    *,
    restart: bool,
    reason: str,
    since: float,
) -> Decision:
    """Submit the run's next job where it can be placed. When Slurm would refuse every exclude
    list (nodes in service that must stay out leave the partition too small), nothing is
    submitted: the run waits, says for which nodes, and is looked at again every tick."""
    placement = place(run, obs.snapshot, obs.quarantined, policy.when_short)
    notes = placement_notes(run, a, placement, since, obs.now, policy.stuck_page_s, waiting=not placement.submittable)
    if not placement.submittable:
        return Decision(notes.events, (), notes.recheck_at, waiting=True)
    submit = Submit(run.name, placement.exclude, restart=restart, reason=reason)
    return Decision(notes.events, (submit,), notes.recheck_at)


def _held_after_our_prolog(run: RunRecord, job: JobInfo) -> bool:
    """The prolog's failure and this run's own drain of the same node race: Slurm may then keep the
    launch-failure hold as an admin's hold and lose its description. The hold is ours to lift when
    the requeued incarnation's fault was a prolog finding on a node this run excluded for it; a
    person's hold (USER, or ADMIN without that fault) is kept."""
    return (
        job.restart_count > 0 and job.hold is JobHold.ADMIN and any("[prolog" in why for why in run.excluded.values())
    )


def _requeued_by_slurm(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation, policy: Policy) -> Decision:
    records: list[Record] = []
    if a.ended_at is None:
        records.append(
            AttemptEnded(
                run.name, a.seq, obs.now, "REQUEUED", f"requeued by Slurm ({job.state_reason or 'no reason given'})"
            )
        )
    bad = faulty_nodes(run, a.nodes, obs)
    contained, actions = _contain(run, a, bad, obs, policy)
    records += contained
    excluded = tuple(sorted(set(run.excluded) | set(bad)))
    records += [
        AttemptRequeued(run.name, job.job_id, job.restart_count, obs.now, excluded),
        SetState(run.name, RunState.QUEUED, spend_restart=True),
        _event(
            run,
            a,
            EventKind.REQUEUED,
            f"Slurm requeued job {job.job_id} (restart {job.restart_count})",
            obs,
            {"state_reason": job.state_reason, "bad_nodes": dict(bad)},
        ),
    ]
    return Decision(tuple(records), tuple(actions))


def _finished(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation, policy: Policy) -> Decision:
    records: list[Record] = []
    if a.ended_at is None:
        records.append(
            AttemptEnded(
                run.name,
                a.seq,
                job.end_time or obs.now,
                job.state.value,
                job.state_reason or job.state.value,
                job.exit_code,
            )
        )
    if run.state is RunState.RECOVERING:
        how = (
            f"is left only on fenced-off {_fmt(job.nodes)} (Slurm still completing it there)"
            if job.completing
            else f"ended {job.state.value} after the fault"
        )
        records.append(
            _event(
                run,
                a,
                EventKind.STOPPED,
                f"{a.label} {how}",
                obs,
                {"state": job.state.value, "exit_code": job.exit_code, "nodes": list(job.nodes)},
                str(job.job_id),
            )
        )
    done = Decision(tuple(records))
    if run.state is RunState.RECOVERING:
        rollback = obs.rollbacks.get(run.name)
        why = (
            f"rollback to step {rollback.checkpoint_step} after the loss spike at step {rollback.onset_step}"
            if rollback
            else "replacing the incarnation stopped after a fault"
        )
        return done + _restart(run, a, job, obs, policy, why)
    if job.state is JobState.COMPLETED and (job.exit_code or 0) == 0:
        return done + _set_terminal(run, RunState.COMPLETED, EventKind.COMPLETED, f"job {job.job_id} completed", obs)
    if job.exit_code is not None and job.exit_code in run.spec.do_not_restart_exit_codes:
        why = f"job {job.job_id} exited with do-not-restart code {job.exit_code}; not restarting"
        return done + _set_terminal(run, RunState.FAILED, EventKind.GAVE_UP, why, obs)
    if job.state is JobState.CANCELLED:
        failed_on = _launch_failed_on(job, obs)
        if failed_on:  # not a person's cancel: Slurm ended a job it could not requeue (--no-requeue)
            return done + _recover_finished(run, a, job, failed_on, obs, policy)
        if _just_launched(job) and obs.now - (job.end_time or obs.now) < LAUNCH_WINDOW_S:
            return done  # cancelled as it started: give Slurm a moment to show a prolog's drain
        return done + _set_terminal(
            run,
            RunState.CANCELLED,
            EventKind.CANCELLED,
            f"job {job.job_id} was cancelled outside the supervisor; not restarting",
            obs,
        )
    bad = faulty_nodes(run, a.nodes or job.nodes, obs)
    if bad:
        return done + _recover_finished(run, a, job, bad, obs, policy)
    nodes = a.nodes or job.nodes
    ended = job.end_time or obs.now
    if policy.evidence_wait_s > 0 and set(nodes) & obs.agents and obs.now < ended + policy.evidence_wait_s:
        # A GPU fault kills the job at once; the node's agent says which node at its next sample.
        # Restarting before that would put the run back on the broken node: wait that long.
        return done + Decision(recheck_at=ended + policy.evidence_wait_s)
    why = f"job {job.job_id} ended {job.state.value}" + (f" with exit code {job.exit_code}" if job.exit_code else "")
    fault = _event(
        run,
        a,
        EventKind.FAULT,
        why,
        obs,
        {"state": job.state.value, "exit_code": job.exit_code, "state_reason": job.state_reason},
    )
    return done + Decision((fault, SetState(run.name, RunState.RECOVERING, reason=why)))


def _launch_failed_on(job: JobInfo, obs: Observation) -> dict[str, str]:
    """Nodes whose prolog failed the job's launch: Slurm drained them (the adapter read its reason)
    and, the job not being requeueable, cancelled it the second it started."""
    if not _just_launched(job):
        return {}
    out = {}
    for name in job.nodes:
        info = obs.snapshot.nodes.get(name)
        if info is not None and info.drained and info.prolog_failed:
            out[name] = f"the job's prolog failed on it: Slurm drained it ({info.reason})"
    return out


LAUNCH_WINDOW_S = 10.0


def _just_launched(job: JobInfo) -> bool:
    return job.start_time is not None and job.end_time is not None and job.end_time - job.start_time <= LAUNCH_WINDOW_S


def _recover_finished(
    run: RunRecord, a: AttemptRecord, job: JobInfo, bad: Mapping[str, str], obs: Observation, policy: Policy
) -> Decision:
    decision = _recover(run, a, job, bad, obs, policy)
    actions = tuple(x for x in decision.actions if not isinstance(x, Cancel))
    return Decision(decision.records, actions)


def _restart(
    run: RunRecord, a: AttemptRecord, job: JobInfo | None, obs: Observation, policy: Policy, reason: str
) -> Decision:
    if run.restarts_spent >= run.spec.max_restarts:
        why = f"restart budget spent ({run.restarts_spent} of {run.spec.max_restarts}); giving up"
        return _set_terminal(run, RunState.FAILED, EventKind.GAVE_UP, why, obs)
    actions: list[Action] = []
    records: list[Record] = []
    dead = sorted(n for n in set(a.nodes) & set(run.excluded) if _unreachable(obs, n))
    if policy.fence and job is not None:
        actions += [Fence(run.name, n, a.job_id) for n in dead]
    elif dead:
        msg = (
            f"no fence command: cannot confirm that nothing of {a.label} still runs on {_fmt(tuple(dead))}; "
            "Slurm kills leftovers when the node's slurmd returns (set fence.command to power it off)"
        )
        records.append(_event(run, a, EventKind.WARNING, msg, obs, {"nodes": dead}, "unfenced"))
    since = a.ended_at if a.ended_at is not None else obs.now
    return Decision(tuple(records), tuple(actions)) + _submit(
        run, a, obs, policy, restart=True, reason=reason, since=since
    )


def _unreachable(obs: Observation, node: str) -> bool:
    """Slurm cannot reach the node: what runs there cannot be confirmed stopped without a fence.
    A node drained for a GPU fault still answers; its slurmd kills the cancelled job."""
    info = obs.snapshot.nodes.get(node)
    return info is None or info.down or not info.responding or node in obs.dead


def _vanished(run: RunRecord, a: AttemptRecord, obs: Observation, policy: Policy) -> Decision:
    ended = (
        ()
        if a.ended_at is not None
        else (AttemptEnded(run.name, a.seq, obs.now, "VANISHED", "job no longer known to Slurm"),)
    )
    if run.state is RunState.RECOVERING:
        return Decision(ended) + _restart(run, a, None, obs, policy, "replacing the incarnation stopped after a fault")
    why = (
        f"job {a.job_id} is no longer known to Slurm and its outcome is unknown (it ended longer than "
        "MinJobAge ago); not restarting blindly. Check the job's output, then submit the spec under a new run name"
    )
    return Decision(ended) + _set_terminal(run, RunState.FAILED, EventKind.GAVE_UP, why, obs)


def _cancel(run: RunRecord, a: AttemptRecord, job: JobInfo | None, obs: Observation) -> Decision:
    if job is not None and not job.state.finished:
        return Decision(actions=(Cancel(run.name, job.job_id, "cancel requested"),))
    if job is not None and job.completing:
        return Decision()
    return _set_terminal(run, RunState.CANCELLED, EventKind.CANCELLED, "cancelled on request", obs)


def _set_terminal(run: RunRecord, state: RunState, kind: EventKind, why: str, obs: Observation) -> Decision:
    return Decision((SetState(run.name, state, reason=why), _event(run, run.attempt, kind, why, obs)))


def _event(
    run: RunRecord,
    a: AttemptRecord | None,
    kind: EventKind,
    message: str,
    obs: Observation,
    evidence: Mapping[str, Any] | None = None,
    suffix: str = "",
) -> Event:
    seq = a.seq if a else None
    key = f"{run.name}:{seq}:{kind.value}:{suffix}"
    return Event(
        run.name, kind, message, key, obs.now, seq, a.job_id if a else None, "supervisor", dict(evidence or {})
    )


def _fmt(nodes: tuple[str, ...]) -> str:
    return ",".join(nodes) or "(no nodes)"
