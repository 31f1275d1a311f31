"""No gap in the queue: the run's next job is submitted before its current one ends. Pure.

With ``[continuation] prequeue_s``, that long before the job's time limit (``time_limit_s`` after
its start) the successor is submitted **held**, behind ``--dependency=afterany`` on the current job
(``Submit.after_job``; journaled like every submission, so a daemon killed right after the sbatch
finds it again by its tag: exactly one). It is on record as the run's ``successor``, not yet an
attempt. When the current job's planned end is continued, the successor becomes the next attempt
(``StartSuccessor``: the resume file rewritten with the newest verified checkpoint *as of then*,
its exclude list made current, its hold released). When it is not — a fault in the last window,
a completion, a block, a cancel — the successor is cancelled, and the fault path submits a
replacement that keeps the bad nodes out. Held until its predecessor has ended and been judged,
and behind the dependency besides: never two incarnations training at once.

Why a hold and not the dependency alone: a job's environment is fixed at its submission, and the
predecessor's last save comes after it; the successor must read the checkpoint from the resume
file, and only a hold guarantees that file is rewritten before it starts (a released job starts
within the scheduler's next pass, one daemon tick after its predecessor's end).
"""

from __future__ import annotations

from supervisor.domain.actions import Cancel, Decision, SetState, StartSuccessor, Submit, SuccessorDropped
from supervisor.domain.cluster import JobState
from supervisor.domain.decide.placement import place
from supervisor.domain.observation import Observation, Policy
from supervisor.domain.records import AttemptRecord, RunRecord, Successor
from supervisor.domain.run import RunState


def successor_decision(run: RunRecord, decided: Decision, obs: Observation, policy: Policy) -> Decision:
    """What the successor needs beside this tick's ``decided``: pre-queued, kept, or cancelled."""
    s = run.successor
    if s is None:
        return _prequeue(run, decided, obs, policy)
    if _still_wanted(run, s, decided):
        return Decision()
    job = obs.snapshot.jobs.get(s.job_id)
    if job is not None and not job.state.finished:
        why = f"the pre-queued successor is not wanted: {_why_not(run, decided)}"
        return Decision(actions=(Cancel(run.name, s.job_id, why),))
    if run.state.terminal:
        return Decision()  # the run is over: the record is history
    return Decision((SuccessorDropped(run.name, s.job_id),))


def _still_wanted(run: RunRecord, s: Successor, decided: Decision) -> bool:
    a = run.attempt
    return (
        a is not None
        and a.seq == s.after_seq
        and run.state in (RunState.RUNNING, RunState.QUEUED)
        and not run.cancel_requested
        and not any(isinstance(r, SetState) for r in decided.records)
    )


def _why_not(run: RunRecord, decided: Decision) -> str:
    for r in decided.records:
        if isinstance(r, SetState):
            return f"the run goes {r.state.value}"
    if run.cancel_requested:
        return "the run is being cancelled"
    return f"the run is {run.state.value}"


def _prequeue(run: RunRecord, decided: Decision, obs: Observation, policy: Policy) -> Decision:
    a, c = run.attempt, run.spec.continuation
    if a is None or c is None or not c.prequeue_s or c.time_limit_s is None or decided.records or decided.actions:
        return Decision()
    if run.state is not RunState.RUNNING or run.cancel_requested or a.started_at is None or a.ended_at is not None:
        return Decision()
    job = obs.snapshot.jobs.get(a.job_id)
    due = a.started_at + c.time_limit_s - c.prequeue_s
    if job is None or job.state is not JobState.RUNNING or obs.now < due or obs.refused.get(run.name):
        return Decision(recheck_at=due if obs.now < due else None)
    placement = place(run, obs.snapshot, obs.quarantined, policy.when_short)
    if not placement.submittable:
        return Decision()  # submitted at the end as before, when it can be placed
    reason = f"pre-queued {c.prequeue_s} s before job {a.job_id}'s time limit, held until it ends"
    return Decision(actions=(Submit(run.name, placement.exclude, restart=False, reason=reason, after_job=a.job_id),))


def start_successor(run: RunRecord, a: AttemptRecord, obs: Observation, policy: Policy, reason: str) -> Decision | None:
    """The planned end was continued and a successor waits behind it: start that one (None: none)."""
    s = run.successor
    if s is None or s.after_seq != a.seq:
        return None
    job = obs.snapshot.jobs.get(s.job_id)
    if job is None or job.state.finished:
        return None  # gone (someone's scancel): a new submission instead, SuccessorDropped next tick
    placement = place(run, obs.snapshot, obs.quarantined, policy.when_short, current=job.excluded_nodes)
    exclude = placement.exclude if placement.submittable else job.excluded_nodes
    return Decision(actions=(StartSuccessor(run.name, s.job_id, tuple(exclude), reason),))
