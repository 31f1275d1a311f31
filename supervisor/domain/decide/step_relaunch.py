"""In-allocation: a step that died with no node at fault — a software bug, an NCCL error, a
trainer's data check; a quarter of Llama 3's interruptions — or that hangs (an NCCL watchdog) is
relaunched in place: the step's next generation on the same nodes (a hang's ranks that single out
nodes: without them, hot spares in their places), from the newest verified checkpoint, in the
same job. No new allocation, no queue (a resubmitted job also loses its age priority), no job start-up. Pure
(docs/in-allocation.md).

What stays as it was: a step that succeeded ends the job (the launcher exits 0); a do-not-restart
code ends the run (the launcher exits with it after its wait); node agents' evidence is awaited
first, as for a job that died, so that a GPU fault's XID swaps the node out rather than relaunching
on it; a fast failure or a spent restart budget falls back to resubmission, whose pacing (backoff,
crash loop, budget) then decides — a relaunch spends one restart, as a resubmission does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from supervisor.domain.actions import Decision, Defer, SwapStep
from supervisor.domain.alloc_step import AllocationStep, LauncherReport, StepGoal
from supervisor.domain.cluster import JobInfo
from supervisor.domain.decide.exit_codes import meaning_of
from supervisor.domain.observation import Observation, Policy, event_for, fmt_nodes
from supervisor.domain.records import AttemptRecord, EventKind, RunRecord
from supervisor.domain.run import ExitMeaning
from supervisor.domain.spikes.rollback import RollbackRecord


def current_report(a: AttemptRecord, goal: StepGoal | None, step: AllocationStep) -> LauncherReport | None:
    """The launcher's newest report when it is about the step the daemon wants now (None: no
    report, or one about an older generation or another job)."""
    report = step.report
    generation = goal.generation if goal is not None else 0
    if report is None or report.job_id != a.job_id or report.generation != generation:
        return None
    return report


def died_step(a: AttemptRecord, goal: StepGoal | None, step: AllocationStep) -> LauncherReport | None:
    """The launcher's report that the step the daemon wants now ended unsuccessfully (None: it
    runs, succeeded, or the report is about an older generation or another job)."""
    report = current_report(a, goal, step)
    if report is None or report.alive or report.exit_code is None or report.exit_code == 0:
        return None
    return report


def left_to_end(run: RunRecord, report: LauncherReport) -> bool:
    """A code that says restarting the step will not help (or that it ended on purpose, saved):
    the launcher's exit ends the job, whose end decides the run (domain.decide.lifecycle)."""
    return meaning_of(run.spec, report.exit_code) in (ExitMeaning.STOP, ExitMeaning.CONTINUE)


def evidence_due(current: tuple[str, ...], report: LauncherReport, obs: Observation, policy: Policy) -> float | None:
    """Until when the step nodes' agents are given to say whether a node killed the step."""
    until = report.ended + policy.evidence_wait_s
    if policy.evidence_wait_s > 0 and obs.now < until and not obs.agents.isdisjoint(current):
        return until
    return None


def relaunch_refused(
    run: RunRecord, a: AttemptRecord, job: JobInfo, goal: StepGoal | None, report: LauncherReport
) -> str | None:
    """Why the dead step is not relaunched in place (None: it is)."""
    died = f"step generation {report.generation} exited with code {report.exit_code}"
    return _refused(run, a, job, goal, died, report.ended)


def hang_refused(run: RunRecord, a: AttemptRecord, job: JobInfo, goal: StepGoal | None, now: float) -> str | None:
    """Why the hung step is not relaunched in place (None: it is)."""
    return _refused(run, a, job, goal, f"step generation {goal.generation if goal else 0} hung", now)


def _refused(run: RunRecord, a: AttemptRecord, job: JobInfo, goal: StepGoal | None, what: str, at: float) -> str | None:
    launched = goal.decided_at if goal is not None else (a.started_at or job.start_time or at)
    ran = max(0.0, at - launched)
    if ran < run.spec.pacing.fast_failure_s:
        return f"{what} {ran:.0f} s after its launch (a fast failure: the restart pacing decides)"
    if run.restarts_spent >= run.spec.max_restarts:
        return f"{what}; restart budget spent ({run.restarts_spent} of {run.spec.max_restarts})"
    return None


def relaunch(
    run: RunRecord, a: AttemptRecord, current: tuple[str, ...], report: LauncherReport, obs: Observation
) -> Decision:
    """The fault on record and the step's next generation on the same nodes (one restart spent)."""
    message = (
        f"{a.label}: step generation {report.generation} exited with code {report.exit_code} on "
        f"{fmt_nodes(current)}; no node found faulty: relaunching it in place"
    )
    evidence: dict[str, object] = {
        "in_allocation": "step_died",
        "generation": report.generation,
        "exit_code": report.exit_code,
        "nodes": list(current),
        "detection_s": round(max(0.0, obs.now - report.ended), 1),  # from the launcher's first report of it
    }
    fault = event_for(run, a, EventKind.FAULT, message, obs, evidence, f"step-died-{report.generation}")
    why = f"step generation {report.generation} exited with code {report.exit_code}, no node at fault"
    action = SwapStep(run.name, a.job_id, report.generation + 1, current, (), (), why, restart=True)
    return Decision((fault,), (action,))


def rollback_refused(run: RunRecord) -> bool:
    """A rollback is carried out in place unless the restart budget is spent (then the job is
    stopped and the run's pacing decides, as for a resubmitting run)."""
    return run.restarts_spent >= run.spec.max_restarts


def rollback_relaunch(
    run: RunRecord, a: AttemptRecord, generation: int, current: tuple[str, ...], rollback: RollbackRecord
) -> Decision:
    """A loss spike that did not heal: the step's next generation on the same nodes, one restart
    spent. Its resume plan, made when the swap is performed, is the rollback's: the checkpoint
    before the onset, the data skipped, the LR scaled (engine/watch/resume.py); the rollback's logbook
    line was written when it was planned."""
    why = f"rollback to step {rollback.checkpoint_step} after the loss spike at step {rollback.onset_step}"
    return Decision((), (SwapStep(run.name, a.job_id, generation + 1, current, (), (), why, restart=True),))


def hang_relaunch(
    run: RunRecord,
    a: AttemptRecord,
    generation: int,
    current: tuple[str, ...],
    hang: Mapping[str, Any],
    swapped: tuple[tuple[str, ...], tuple[str, ...]],
    obs: Observation,
) -> Decision:
    """A hang (an NCCL watchdog, a collective that never completes): the fault on record and the
    step's next generation, one restart spent — on the same nodes, or without the nodes its ranks
    single out, hot spares in their places. Those are deferred (kept out of the step, the hot
    spares and the next job), not excluded: an excluded node of the job counts as faulty and would
    be drained, and a stopped rank is no proof of a broken node."""
    out, into = swapped
    said = hang.get("reason", "no progress")
    if out:
        what = f"{hang.get('suspects', 'singled out')}: {fmt_nodes(out)} out, hot spare {fmt_nodes(into)} in"
    else:
        what = "no node singled out: relaunching it in place"
    message = f"{a.label}: hang: {said} on {fmt_nodes(current)}; {what}"
    evidence = {**hang, "in_allocation": "step_hung", "generation": generation, "nodes": list(current)}
    fault = event_for(run, a, EventKind.FAULT, message, obs, evidence, f"hang-{generation}")
    kept_out = tuple(Defer(run.name, n, f"hang: {hang.get('suspects', 'singled out')}") for n in out)
    nodes = tuple(n for n in current if n not in out) + into
    why = f"step generation {generation} hung ({said})" + (f", {fmt_nodes(out)} singled out" if out else "")
    action = SwapStep(run.name, a.job_id, generation + 1, nodes, out, into, why, restart=True)
    return Decision((fault, *kept_out), (action,))
