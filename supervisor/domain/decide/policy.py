"""The supervisor's decisions for one run on one snapshot. Pure: no I/O, no clock, no logging.

``decide(run, observation, policy)`` looks at the run's record and what Slurm (and the direct node
probes) show now, and returns the records to write and the actions to take. The engine executes
them; the next tick sees their effect. Every branch is idempotent: deciding twice on the same
inputs asks for nothing that already took effect.

Here: the dispatch on the job's state, and nodes that returned to service. A running job's
decisions are in ``faults`` (``in_allocation`` for a run that recovers inside its job); a queued, requeued, finished or vanished job's in ``lifecycle``; what
all of them share in ``observation``; where the next job may go in ``placement``.
"""

from __future__ import annotations

from dataclasses import replace

from supervisor.domain.actions import (
    ChangeNode,
    Decision,
    Record,
    Unexclude,
)
from supervisor.domain.cluster import JobInfo, JobState, NodeChange
from supervisor.domain.decide.completing import decide_completing
from supervisor.domain.decide.faults import decide_running
from supervisor.domain.decide.in_allocation import decide_in_allocation
from supervisor.domain.decide.lifecycle import (
    decide_cancel,
    decide_finished,
    decide_pending,
    decide_requeued,
    decide_vanished,
    submit_next,
)
from supervisor.domain.decide.preempted import preempting
from supervisor.domain.decide.prequeue import successor_decision
from supervisor.domain.observation import (
    REASON_PREFIX,
    Observation,
    Policy,
    event_for,
    marked_by_us,
    node_reason,
    set_terminal,
)
from supervisor.domain.records import AttemptRecord, EventKind, RunRecord
from supervisor.domain.run import RestartMode, RunState

__all__ = ["REASON_PREFIX", "Observation", "Policy", "decide", "node_reason"]


def decide(run: RunRecord, obs: Observation, policy: Policy) -> Decision:
    decision = _returned(run, obs) + _decide(_without_returned(run, obs), obs, policy)
    decision = decision + successor_decision(run, decision, obs, policy)
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
            event_for(
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
        if info is not None and info.down and not info.drained and marked_by_us(info.reason, obs.account, run.name):
            out.append(ChangeNode(run.name, name, NodeChange.DRAIN, info.reason))
    return tuple(out)


def _decide(run: RunRecord, obs: Observation, policy: Policy) -> Decision:
    if run.state.terminal:
        return Decision()
    attempt = run.attempt
    if attempt is None:
        if run.cancel_requested:
            return set_terminal(run, RunState.CANCELLED, EventKind.CANCELLED, "cancelled before any job ran", obs)
        return submit_next(run, None, obs, policy, restart=False, reason="first submission", since=run.created_at)
    job = obs.snapshot.jobs.get(attempt.job_id)
    if run.cancel_requested:
        return decide_cancel(run, attempt, job, obs)
    if job is None:
        return decide_vanished(run, attempt, obs, policy)
    return preempting(run, attempt, job, obs) + _by_state(run, attempt, job, obs, policy)


def _by_state(run: RunRecord, attempt: AttemptRecord, job: JobInfo, obs: Observation, policy: Policy) -> Decision:
    if job.restart_count > attempt.restart_count:
        return decide_requeued(run, attempt, job, obs, policy)
    if job.state is JobState.PENDING:
        return decide_pending(run, attempt, job, obs, policy)
    if job.state is JobState.RUNNING and run.spec.restart_mode is RestartMode.IN_ALLOCATION:
        return decide_in_allocation(run, attempt, job, obs, policy)
    if job.state in (JobState.RUNNING, JobState.SUSPENDED):
        return decide_running(run, attempt, job, obs, policy)
    if job.state.finished and not job.completing:
        return decide_finished(run, attempt, job, obs, policy)
    if job.completing:
        return decide_completing(run, attempt, job, obs, policy)
    return Decision()  # an unknown state: wait for the next snapshot
