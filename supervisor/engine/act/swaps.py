"""Performing an in-allocation swap or relaunch in place (``SwapStep``): the step goal the job's
launcher converges on, written once per generation (the store's key: writing it again changes
nothing), then its logbook line and, for a relaunch after a failure, the restart it spends."""

from __future__ import annotations

from typing import Any

from supervisor.domain.actions import Action, SwapStep
from supervisor.domain.alloc_step import StepGoal
from supervisor.domain.decide.in_allocation import swap_event
from supervisor.domain.records import Event, RunRecord
from supervisor.ports import StepLedger, Store


def write_goal(store: StepLedger, run: str, action: SwapStep, now: float) -> dict[str, Any]:
    """The launcher converges on it at its next poll."""
    goal = StepGoal(action.job_id, action.generation, action.nodes, action.reason, now, action.resume)
    store.set_step_goal(run, goal)
    return {"generation": action.generation}


def goal_written(store: StepLedger, run: str, action: Action) -> dict[str, Any] | None:
    """A swap whose goal is in the store already took effect (the launcher reads it there)."""
    if not isinstance(action, SwapStep):
        return None
    goal = store.step_goal(run, action.job_id)
    return {"generation": goal.generation} if goal is not None and goal.generation >= action.generation else None


def swap_done(store: Store, run: RunRecord, action: SwapStep, now: float) -> list[Event]:
    """Inside the intent's completing transaction: a relaunch after the step failed is a restart,
    as a resubmission is; a planned rollback the new generation resumes by is carried out; the
    logbook line."""
    if action.restart:
        state = (store.get_run(run.name) or run).state
        store.set_state(run.name, state, now, spend_restart=True)
    if action.resume is not None and action.resume.rollback is not None and run.attempt is not None:
        store.rollbacks_done(run.name, run.attempt.seq + 1)  # this generation carries the rollback out
    return [swap_event(run, action, now)]
