"""Decisions on a running job: which of its nodes are faulty, how a fault is contained (fault
records, the node kept out, DOWN/DRAIN within the blast radius, one ``mass_fault`` per incident
beyond it), hangs, degraded nodes dropped at
a checkpoint boundary. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from supervisor.domain.actions import (
    Action,
    AttemptStarted,
    Cancel,
    ChangeNode,
    Decision,
    Defer,
    Exclude,
    Record,
    SetState,
)
from supervisor.domain.cluster import JobInfo, JobState, NodeChange
from supervisor.domain.decide.survivors import hold_for_survivors, survivors_save_until
from supervisor.domain.health.findings import Severity
from supervisor.domain.health.quarantine import Fault
from supervisor.domain.observation import (
    Observation,
    Policy,
    event_for,
    fmt_nodes,
    marked_by_us,
    node_reason,
)
from supervisor.domain.records import AttemptRecord, Event, EventKind, NodeVerdict, RunRecord, Verdict
from supervisor.domain.run import RestartMode, RunState


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


def decide_running(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation, policy: Policy) -> Decision:
    records: list[Record] = []
    if a.started_at is None:
        records += [
            AttemptStarted(run.name, a.seq, job.nodes, job.start_time or obs.now),
            event_for(
                run,
                a,
                EventKind.STARTED,
                f"{a.label} running on {fmt_nodes(job.nodes)}",
                obs,
                {"nodes": list(job.nodes)},
            ),
        ]
        if run.state is not RunState.RECOVERING:
            records.append(SetState(run.name, RunState.RUNNING))
    bad = faulty_nodes(run, job.nodes, obs)
    until = survivors_save_until(run, bad, obs) if run.state is not RunState.RECOVERING else None
    if until is not None:
        return Decision(tuple(records)) + hold_for_survivors(run, a, bad, until, "job", obs)
    if bad:
        return Decision(tuple(records)) + recover(run, a, job, bad, obs, policy)
    if run.name in obs.rollbacks and run.state is not RunState.RECOVERING:
        why = f"rollback after the loss spike at step {obs.rollbacks[run.name].onset_step}"
        records.append(SetState(run.name, RunState.RECOVERING, reason=why))
        return Decision(tuple(records), (Cancel(run.name, job.job_id, why),))
    if run.name in obs.hangs and run.state is not RunState.RECOVERING:
        return Decision(tuple(records)) + _recover_hang(run, a, job, obs.hangs[run.name], obs)
    if run.state is RunState.RECOVERING:
        # A fault was recorded earlier; finish stopping this incarnation.
        return Decision(tuple(records), stop_job(run, job, "finishing recovery started earlier", obs))
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
            event_for(
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
    why = f"checkpoint boundary: dropping degraded {fmt_nodes(tuple(nodes))}"
    evidence = {"nodes": {n: run.deferred[n][1] for n in nodes}, "checkpoint_at": ckpt, "planned": True}
    fault = event_for(
        run, a, EventKind.FAULT, f"{a.label}: {why} ({'; '.join(run.deferred[n][1] for n in nodes)})", obs, evidence,
        "boundary",
    )  # fmt: skip
    # Each degraded node dropped (a straggler, a throttling GPU) is a fault quarantine counts.
    faults = [Fault(n, obs.now, run.name, run.deferred[n][1], key=f"{fault.key}:{n}", source="degraded") for n in nodes]
    records: list[Record] = [fault, *faults, SetState(run.name, RunState.RECOVERING, reason=why)]
    actions: list[Action] = []
    drains_left = policy.drains_left
    for node in nodes:
        if (
            policy.may_change_nodes
            and drains_left > 0
            and not marked_by_us(_reason_of(obs, node), obs.account, run.name)
        ):
            actions.append(
                ChangeNode(run.name, node, NodeChange.DRAIN, node_reason(obs.account, run.name, run.deferred[node][1]))
            )
            drains_left -= 1
    return Decision(tuple(records), tuple(actions) + stop_job(run, job, why, obs, actions))


def _reason_of(obs: Observation, node: str) -> str:
    info = obs.snapshot.nodes.get(node)
    return info.reason if info else ""


def recover(
    run: RunRecord, a: AttemptRecord, job: JobInfo, bad: Mapping[str, str], obs: Observation, policy: Policy
) -> Decision:
    records, actions = contain(run, a, bad, obs, policy)
    records.append(
        SetState(run.name, RunState.RECOVERING, reason="; ".join(f"{n}: {w}" for n, w in sorted(bad.items())))
    )
    actions += stop_job(run, job, f"node fault on {fmt_nodes(tuple(bad))}", obs, actions)
    return Decision(tuple(records), tuple(actions))


# A mass fault on an attempt that has not yet run this long, while the run still keeps out nodes an
# earlier mass fault left over the cap, continues that incident: no second logbook entry or page.
INCIDENT_QUIET_S = 600.0


def contain(
    run: RunRecord, a: AttemptRecord, bad: Mapping[str, str], obs: Observation, policy: Policy
) -> tuple[list[Record], list[Action]]:
    """Fault records for each bad node (it is kept out of the run), and the node changes that take
    it out of service within the blast radius. Beyond the caps a node is kept out of the run but
    not drained, and the incident is one ``mass_fault`` entry for a human."""
    records: list[Record] = []
    actions: list[Action] = []
    drains_left = policy.drains_left
    capped: list[str] = []
    for node, why in sorted(bad.items()):
        if policy.may_change_nodes and drains_left <= 0 and _needs_change(run, node, obs):
            capped.append(node)
            records += _fault_records(run, a, node, why, obs, capped=True) + [_not_drained(run, a, node, obs)]
            continue
        records += _fault_records(run, a, node, why, obs)
        items, drains_left = _node_change(run, a, node, why, obs, policy, drains_left)
        actions += [x for x in items if isinstance(x, ChangeNode)]
        records += [x for x in items if not isinstance(x, ChangeNode)]
    if capped and not _incident_continues(run, a, bad, obs):
        drained = sorted({x.node for x in actions if isinstance(x, ChangeNode)})
        records.append(_mass_fault(run, a, bad, drained, capped, obs))
    return records, actions


def _needs_change(run: RunRecord, node: str, obs: Observation) -> bool:
    """Taking the node out of service would take a drain: it is not already drained by someone
    else, nor downed or drained by this run."""
    info = obs.snapshot.nodes.get(node)
    drained_elsewhere = (
        info is not None and info.drained and info.responding and not marked_by_us(info.reason, obs.account, run.name)
    )
    return not drained_elsewhere and not _handled(run, node, obs)


def _not_drained(run: RunRecord, a: AttemptRecord, node: str, obs: Observation) -> Event:
    msg = (
        f"{node} excluded from run {run.name}; not drained: the blast-radius cap is reached "
        "(daemon.max_drains_per_hour, max_drains_per_run_per_hour); it stays in service in Slurm for a human to judge"
    )
    return event_for(run, a, EventKind.NODE_EXCLUDED, msg, obs, {"node": node}, f"{node}:blast")


def _incident_continues(run: RunRecord, a: AttemptRecord, bad: Mapping[str, str], obs: Observation) -> bool:
    """The run keeps out nodes an earlier mass fault left in service (over the cap, not drained),
    and this attempt has not run for ``INCIDENT_QUIET_S`` yet: the same incident goes on."""
    started = a.started_at if a.started_at is not None else obs.now
    if obs.now - started >= INCIDENT_QUIET_S:
        return False
    return any(
        (info := obs.snapshot.nodes.get(n)) is not None and info.responding and not info.down and not info.drained
        for n in run.excluded
        if n not in bad
    )


def _mass_fault(
    run: RunRecord, a: AttemptRecord, bad: Mapping[str, str], drained: list[str], capped: list[str], obs: Observation
) -> Event:
    """One entry per incident, keyed by the attempt it began on (the page's dedup key too)."""
    msg = (
        f"mass fault: {len(bad)} nodes of {a.label} faulted at once; the blast-radius cap allowed "
        f"{len(drained)} drain(s) ({fmt_nodes(tuple(drained))}); {len(capped)} excluded from the run but "
        f"not drained, for a human to judge: {fmt_nodes(tuple(capped))}; the run restarts without them"
    )
    evidence = {"faulted": dict(sorted(bad.items())), "drained": drained, "excluded": capped}
    event = event_for(run, a, EventKind.MASS_FAULT, msg, obs, evidence)
    return replace(event, key=f"{run.name}:mass_fault:{a.seq}")


def _handled(run: RunRecord, node: str, obs: Observation) -> bool:
    """This run already downed or drained the node: no new node change is needed."""
    info = obs.snapshot.nodes.get(node)
    return info is not None and marked_by_us(info.reason, obs.account, run.name) and (info.down or info.drained)


def _recover_hang(
    run: RunRecord, a: AttemptRecord, job: JobInfo, hang: Mapping[str, Any], obs: Observation
) -> Decision:
    """The job runs but its log shows no progress: stop it and restart. No node is blamed unless
    per-rank progress singled it out (``suspect_nodes``): then it is kept out of the restart."""
    why = f"hang: {hang.get('reason', 'no progress')}"
    evidence = {**hang, "nodes": list(job.nodes)}
    records: tuple[Record, ...] = (
        event_for(run, a, EventKind.FAULT, f"{a.label}: {why}", obs, evidence, "hang"),
        SetState(run.name, RunState.RECOVERING, reason=why),
    )
    suspects = [n for n in hang.get("suspect_nodes") or () if n in job.nodes]
    records += tuple(Exclude(run.name, n, f"hang: {hang.get('suspects', 'singled out')}") for n in suspects)
    return Decision(records, (Cancel(run.name, job.job_id, "hang: no training progress"),))


def _fault_records(
    run: RunRecord, a: AttemptRecord, node: str, why: str, obs: Observation, *, capped: bool = False
) -> list[Record]:
    info = obs.snapshot.nodes.get(node)
    evidence: dict[str, Any] = {
        "node": node,
        "observed": why,
        "slurm_state": info.state.value if info else None,
        "slurm_flags": sorted(info.flags) if info else None,
        "slurm_reason": info.reason if info else None,
        "probe": obs.dead.get(node),
    }
    detection = _detection_s(node, obs)
    if detection is not None:
        evidence["detection_s"] = detection
    fault = event_for(run, a, EventKind.FAULT, f"{a.label}: fault on {node}: {why}", obs, evidence, node)
    return [
        fault,
        Fault(node, obs.now, run.name, why, key=fault.key),  # what quarantine counts
        Exclude(run.name, node, why),
        NodeVerdict(
            node,
            Verdict.BAD,
            f"{why}; not drained: blast-radius cap reached",
            evidence,
            run.name,
            "blast-radius",
            obs.now,
        )
        if capped
        else NodeVerdict(node, Verdict.BAD, why, evidence, run.name, "excluded", obs.now),
    ]


def _node_change(
    run: RunRecord, a: AttemptRecord, node: str, why: str, obs: Observation, policy: Policy, drains_left: int
) -> tuple[list[ChangeNode | Event], int]:
    """DOWN (Slurm ends or requeues the job at once), then DRAIN (stays out until an admin resumes it)."""
    info = obs.snapshot.nodes.get(node)
    if info is not None and info.drained and info.responding and not marked_by_us(info.reason, obs.account, run.name):
        msg = f"{node} excluded from run {run.name}; already drained in Slurm ({info.reason or 'no reason'})"
        evidence = {"node": node, "slurm_reason": info.reason}
        return [event_for(run, a, EventKind.NODE_EXCLUDED, msg, obs, evidence, f"{node}:drained")], drains_left
    if info is not None and _handled(run, node, obs):
        done = info.drained
        return ([] if done else [ChangeNode(run.name, node, NodeChange.DRAIN, info.reason)]), drains_left
    if not policy.may_change_nodes:
        msg = f"{node} excluded from run {run.name}; not drained: the supervisor has no node rights (may_change_nodes = false)"
        return [event_for(run, a, EventKind.NODE_EXCLUDED, msg, obs, {"node": node}, f"{node}:norights")], drains_left
    kinds = (NodeChange.DRAIN,) if _alive(run, node, obs) else (NodeChange.DOWN, NodeChange.DRAIN)
    return [ChangeNode(run.name, node, c, node_reason(obs.account, run.name, why)) for c in kinds], drains_left - 1


def _detection_s(node: str, obs: Observation) -> float | None:
    """From the first sign of the fault to this decision: the finding's time when an agent or a
    hook reported it, else the node's first failed probe (None when only Slurm's state says so:
    no onset on record)."""
    found = obs.findings.get(node)
    onset = found.at if found is not None else obs.dead_since.get(node)
    return round(max(0.0, obs.now - onset), 1) if onset is not None else None


def _alive(run: RunRecord, node: str, obs: Observation) -> bool:
    """A node the agent found faulty but that still answers is drained, not downed: its slurmd
    cleans up the cancelled job. Requeue mode relies on DOWN to make Slurm requeue the job."""
    info = obs.snapshot.nodes.get(node)
    return (
        node in obs.findings
        and node not in obs.dead
        and info is not None
        and info.responding
        and not info.down
        and run.spec.restart_mode is RestartMode.RESUBMIT
    )


def stop_job(
    run: RunRecord, job: JobInfo, reason: str, obs: Observation, actions: Sequence[Action] = ()
) -> tuple[Action, ...]:
    """Stop the broken incarnation. In requeue mode Slurm requeues the job by itself once one of
    its nodes is DOWN — when this decision downs one, or one is down already. Otherwise (no node
    rights, a node only drained, over the blast radius, a checkpoint boundary) nothing would stop
    the job: it is cancelled, and the run is resubmitted as in resubmit mode."""
    if run.spec.restart_mode is RestartMode.REQUEUE and job.state is not JobState.SUSPENDED:
        downing = any(
            isinstance(x, ChangeNode) and x.change is NodeChange.DOWN and x.node in job.nodes for x in actions
        )
        if downing or any((info := obs.snapshot.nodes.get(n)) is not None and info.down for n in job.nodes):
            return ()
    return (Cancel(run.name, job.job_id, reason),)
