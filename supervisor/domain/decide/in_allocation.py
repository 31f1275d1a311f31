"""In-allocation recovery: a faulty node of the running step is replaced by a hot spare of the same
job (``swap_step``), or — when the allocation cannot go on — the run falls back to resubmission,
with the reason in the logbook. Pure (docs/in-allocation.md).

The step's nodes are the newest goal's (generation 0: the first ``nodes`` of the allocation, what
the launcher starts by itself). A swap is decided while a node of the step is faulty; once the
goal names the replacement the node is no longer in the step, so deciding again asks for nothing:
one swap per fault, whatever crashes in between (the generation is the idempotency key).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from supervisor.domain.actions import Cancel, Decision, Record, SetState, SwapStep
from supervisor.domain.alloc_step import AllocationStep, LauncherReport, StepGoal, initial_nodes
from supervisor.domain.checkpoints.resume import describe_plan
from supervisor.domain.cluster import JobInfo
from supervisor.domain.decide.faults import contain, decide_running, faulty_nodes, recover
from supervisor.domain.decide.step_relaunch import (
    current_report,
    died_step,
    evidence_due,
    hang_refused,
    hang_relaunch,
    left_to_end,
    relaunch,
    relaunch_refused,
    rollback_refused,
    rollback_relaunch,
)
from supervisor.domain.decide.survivors import hold_for_survivors, survivors_save_until
from supervisor.domain.observation import Observation, Policy, event_for, fmt_nodes, marked_by_us
from supervisor.domain.records import AttemptRecord, Event, EventKind, RunRecord
from supervisor.domain.run import RunState


def decide_in_allocation(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation, policy: Policy) -> Decision:
    """A running job of an in-allocation run: swap, fall back, or the ordinary running-job
    decision on the nodes the run still uses (the step's and the healthy spares)."""
    if run.state is RunState.RECOVERING:  # falling back already: finish stopping the job
        return decide_running(run, a, job, obs, policy)
    step = run.step or AllocationStep()
    goal, current = current_step(run, a, job.nodes)
    bad = faulty_nodes(run, current, obs)
    until = survivors_save_until(run, bad, obs) if _runs(a, goal, step) else None
    if until is not None:
        return hold_for_survivors(run, a, bad, until, "step", obs)
    spares = hot_spares(run, job, current, obs)
    why = cannot_continue(run, a, job, step, bad, len(spares), obs)
    if why is not None:
        return fall_back(run, a, job, bad, why, obs, policy)
    if bad:
        return swap(run, a, goal, current, bad, spares, obs, policy)
    died = died_step(a, goal, step)
    if died is not None and not left_to_end(run, died):
        return _leftovers(run, a, job, current, obs, policy) + _after_death(
            run, a, job, goal, current, died, obs, policy
        )
    rollback = obs.rollbacks.get(run.name)
    if rollback is not None and not rollback_refused(run):
        generation = goal.generation if goal is not None else 0
        leftovers = _leftovers(run, a, job, current, obs, policy)
        return leftovers + rollback_relaunch(run, a, generation, current, rollback)
    hang = obs.hangs.get(run.name)
    suspects = tuple(n for n in (hang or {}).get("suspect_nodes") or () if n in current)
    if hang is not None and len(spares) >= len(suspects):  # else resubmitted without the suspects, as before
        out = (suspects, spares[: len(suspects)])
        return _leftovers(run, a, job, current, obs, policy) + _after_hang(
            run, a, job, goal, current, hang, out, obs, policy
        )
    drops = boundary_drops(run, a, goal, current, obs)
    if drops and len(spares) >= len(drops):  # else the ordinary boundary drop below resubmits
        return swap(run, a, goal, current, drops, spares, obs, policy)
    in_use = set(current) | set(spares)
    view = replace(job, nodes=tuple(n for n in job.nodes if n in in_use))
    return (
        _leftovers(run, a, job, current, obs, policy)
        + _resumed(run, a, goal, step, obs)
        + decide_running(run, a, view, obs, policy)
    )


def _runs(a: AttemptRecord, goal: StepGoal | None, step: AllocationStep) -> bool:
    """The launcher's newest word is that the step the daemon wants now runs."""
    report = current_report(a, goal, step)
    return report is not None and report.alive


def current_step(
    run: RunRecord, a: AttemptRecord, allocation: tuple[str, ...]
) -> tuple[StepGoal | None, tuple[str, ...]]:
    """The goal the attempt's step runs by (None: generation 0) and the step's nodes."""
    step = run.step or AllocationStep()
    goal = step.goal if step.goal is not None and step.goal.job_id == a.job_id else None
    return goal, goal.nodes if goal is not None else initial_nodes(a.nodes or allocation, run.spec.nodes)


def _after_death(
    run: RunRecord,
    a: AttemptRecord,
    job: JobInfo,
    goal: StepGoal | None,
    current: tuple[str, ...],
    died: LauncherReport,
    obs: Observation,
    policy: Policy,
) -> Decision:
    """The step died with no node found faulty (yet): wait for the agents' evidence, then relaunch
    it in place — or fall back to the paced resubmission (domain/decide/step_relaunch.py)."""
    until = evidence_due(current, died, obs, policy)
    if until is not None:
        return Decision(recheck_at=until)
    why = relaunch_refused(run, a, job, goal, died)
    if why is not None:
        return fall_back(run, a, job, {}, why, obs, policy)
    return relaunch(run, a, current, died, obs)


def _after_hang(
    run: RunRecord,
    a: AttemptRecord,
    job: JobInfo,
    goal: StepGoal | None,
    current: tuple[str, ...],
    hang: Mapping[str, Any],
    out: tuple[tuple[str, ...], tuple[str, ...]],
    obs: Observation,
    policy: Policy,
) -> Decision:
    """The step hangs: relaunched in place, without the nodes its ranks single out (``out``: those
    and the hot spares taking their places) — or the paced resubmission."""
    why = hang_refused(run, a, job, goal, obs.now)
    if why is not None:
        return fall_back(run, a, job, {}, why, obs, policy)
    return hang_relaunch(run, a, goal.generation if goal is not None else 0, current, hang, out, obs)


def hot_spares(run: RunRecord, job: JobInfo, current: tuple[str, ...], obs: Observation) -> tuple[str, ...]:
    """Nodes of the allocation outside the step that may take a faulty node's place: healthy,
    not kept out of the run, not quarantined."""
    in_step = frozenset(current)  # a set: the allocation has thousands of nodes
    others = tuple(n for n in job.nodes if n not in in_step)
    faulty = faulty_nodes(run, others, obs)
    return tuple(n for n in others if n not in faulty and n not in run.deferred and n not in obs.quarantined)


def boundary_drops(
    run: RunRecord, a: AttemptRecord, goal: StepGoal | None, current: tuple[str, ...], obs: Observation
) -> dict[str, str]:
    """Degraded nodes of the step (a straggler, a throttling GPU: kept out from the next boundary)
    once a verified checkpoint is newer than the step's launch and their findings: swapped out now,
    losing (almost) no work, as a resubmitting run restarts without them."""
    ckpt = obs.checkpoint_at.get(run.name)
    nodes = [n for n in current if n in run.deferred]
    launched = goal.decided_at if goal is not None else a.started_at
    if ckpt is None or not nodes or launched is None:
        return {}
    if ckpt <= max([launched] + [run.deferred[n][0] for n in nodes]):
        return {}
    return {n: f"checkpoint boundary: dropping degraded {n} ({run.deferred[n][1]})" for n in nodes}


def cannot_continue(
    run: RunRecord,
    a: AttemptRecord,
    job: JobInfo,
    step: AllocationStep,
    bad: Mapping[str, str],
    spares: int,
    obs: Observation,
) -> str | None:
    """Why the allocation cannot carry the run on (None: it can)."""
    report = step.report if step.report is not None and step.report.job_id == a.job_id else None
    # Where the launcher runs: as it says; before it said anything, Slurm's batch host, the
    # allocation's first node (measured: docs/in-allocation.md).
    host = report.host if report is not None else next(iter(a.nodes or job.nodes), "")
    if host in bad:
        return f"the batch host {host} (where the launcher runs) is faulty: {bad[host]}"
    if bad and spares < len(bad):
        return f"no hot spare left for {fmt_nodes(tuple(sorted(bad)))} ({spares} healthy spare(s) in job {job.job_id})"
    heard = max(report.at if report is not None else (a.started_at or job.start_time or obs.now), step.listening_since)
    silent = obs.now - heard
    if silent > run.spec.launcher_timeout_s:
        said = "has not reported" if report is None else "has been silent"
        return f"the launcher in job {job.job_id} {said} for {silent:.0f} s (launcher_timeout_s {run.spec.launcher_timeout_s:g})"
    return None


def fall_back(
    run: RunRecord,
    a: AttemptRecord,
    job: JobInfo,
    bad: Mapping[str, str],
    why: str,
    obs: Observation,
    policy: Policy,
) -> Decision:
    """Today's recovery: the job is stopped (faulty nodes contained) and the run resubmitted."""
    message = f"{a.label}: in-allocation recovery not possible: {why}; falling back to resubmission"
    evidence = {"in_allocation": "fallback", "reason": why, "bad_nodes": dict(bad)}
    note = event_for(run, a, EventKind.FAULT, message, obs, evidence, "in-allocation-fallback")
    if bad:
        return Decision((note,)) + recover(run, a, job, bad, obs, policy)
    stop = (SetState(run.name, RunState.RECOVERING, reason=why),)
    return Decision((note, *stop), (Cancel(run.name, job.job_id, f"in-allocation fallback: {why}"),))


def swap(
    run: RunRecord,
    a: AttemptRecord,
    goal: StepGoal | None,
    current: tuple[str, ...],
    bad: Mapping[str, str],
    spares: tuple[str, ...],
    obs: Observation,
    policy: Policy,
) -> Decision:
    """Faulty nodes of the step contained (kept out, DOWN+DRAIN within the blast radius) and
    replaced by as many hot spares; the step's next generation on the survivors and the spares."""
    records, drains = contain(run, a, bad, obs, policy)
    out = tuple(sorted(bad))
    into = spares[: len(out)]
    nodes = tuple(n for n in current if n not in bad) + into
    generation = (goal.generation if goal is not None else 0) + 1
    why = "; ".join(f"{n}: {bad[n]}" for n in out)
    action = SwapStep(run.name, a.job_id, generation, nodes, out, into, why)
    return Decision(tuple(records), (action, *drains))


def _leftovers(
    run: RunRecord, a: AttemptRecord, job: JobInfo, current: tuple[str, ...], obs: Observation, policy: Policy
) -> Decision:
    """Faulty nodes of the job outside the step — a hot spare that failed, or a node swapped out
    whose DOWN/DRAIN a crashed daemon did not get to — contained like any faulty node while a
    node change is still due (idempotent records; no action once the node is ours)."""
    in_step = frozenset(current)  # a set: the allocation has thousands of nodes
    others = tuple(dict.fromkeys(n for n in (*a.nodes, *job.nodes) if n not in in_step))
    due = {n: why for n, why in faulty_nodes(run, others, obs).items() if not _taken_out(run, n, obs)}
    if not due:
        return Decision()
    records, drains = contain(run, a, due, obs, policy)
    return Decision(tuple(records), tuple(drains))


def _taken_out(run: RunRecord, node: str, obs: Observation) -> bool:
    """Out of service already: drained (by us, Slurm's health check or an admin), or downed by us."""
    info = obs.snapshot.nodes.get(node)
    return info is not None and (info.drained or (info.down and marked_by_us(info.reason, obs.account, run.name)))


def _resumed(
    run: RunRecord, a: AttemptRecord, goal: StepGoal | None, step: AllocationStep, obs: Observation
) -> Decision:
    """The launcher runs the newest generation: one logbook line (keyed by the generation)."""
    report = step.report
    if goal is None or report is None or report.job_id != a.job_id:
        return Decision()
    if report.generation != goal.generation or not report.alive:
        return Decision()
    resume = goal.resume
    chosen = resume.chosen if resume is not None else None
    where = f"checkpoint step {chosen.step}" if chosen is not None else "no verified checkpoint (from scratch)"
    message = (
        f"{a.label}: step generation {goal.generation} running again on {fmt_nodes(report.nodes)} in the same "
        f"job {a.job_id}, resumed from {where}"
    )
    evidence: dict[str, object] = {
        "in_allocation": "resumed",
        "generation": goal.generation,
        "nodes": list(report.nodes),
        "job_id": a.job_id,
        "resume_step": resume.step if resume is not None else None,
        "swap_s": round(max(0.0, report.at - goal.decided_at), 2),
    }
    records: tuple[Record, ...] = (
        event_for(run, a, EventKind.NOTE, message, obs, evidence, f"resumed-{goal.generation}"),
    )
    return Decision(records)


def swap_event(run: RunRecord, action: SwapStep, now: float) -> Event:
    """The logbook line of a swap once its goal is written: which node out, which spare in, which
    checkpoint the step resumes from."""
    plan = f"; {describe_plan(action.resume)}" if action.resume is not None else ""
    if action.out:
        message = (
            f"swap in job {action.job_id}: {fmt_nodes(action.out)} out, hot spare {fmt_nodes(action.into)} in; "
            f"the step's generation {action.generation} runs on {fmt_nodes(action.nodes)}{plan}"
        )
    else:  # a relaunch in place (domain/decide/step_relaunch.py)
        message = (
            f"relaunched in job {action.job_id} on the same nodes: the step's generation {action.generation} "
            f"runs on {fmt_nodes(action.nodes)} ({action.reason}){plan}"
        )
    evidence = {
        "in_allocation": "swap",
        "generation": action.generation,
        "out": list(action.out),
        "into": list(action.into),
        "nodes": list(action.nodes),
        "reason": action.reason,
        "resume_step": action.resume.step if action.resume is not None else None,
        "relaunch": not action.out,
    }
    if action.restart:
        evidence["restarts_spent"] = run.restarts_spent + 1
    a = run.attempt
    seq = a.seq if a else None
    key = f"{run.name}:{seq}:note:swap-{action.generation}"
    return Event(run.name, EventKind.NOTE, message, key, now, seq, action.job_id, evidence=evidence)
