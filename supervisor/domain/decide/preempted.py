"""Preemption seen as it happens, and Slurm's requeue after it (``PreemptMode=REQUEUE``). Pure.

A higher-priority job that takes a running job's nodes does not end it at once: Slurm sets the
job's PreemptTime, sends the steps SIGTERM and gives it the partition's GraceTime; then it requeues
a requeueable job (restart mode "requeue") or ends it. Once the job's end or requeue is seen its
PreemptTime is gone from squeue, so the moment it is first seen it is put on the attempt's record
(``AttemptPreempted``, in the store: a daemon restarted during the grace still knows).

A requeue after a preemption is then a planned end like a time limit's (domain.decide.continuation):
after a verified save at or past the last step logged — the trainer saved on the grace signal — the
requeued job continues from it, no restart spent, no interruption (goodput books the gap under
'preempted'); without one it is the requeue it was before, one restart spent, with its lost work and
a line that says how to make the next one a continuation.
"""

from __future__ import annotations

from supervisor.domain.actions import (
    AttemptEnded,
    AttemptPreempted,
    AttemptRequeued,
    Cancel,
    Decision,
    Record,
    SetState,
)
from supervisor.domain.cluster import JobInfo, JobState
from supervisor.domain.decide.continuation import PREEMPTED, continue_after, unsaved_hint
from supervisor.domain.observation import Observation, event_for
from supervisor.domain.records import AttemptRecord, EventKind, RunRecord
from supervisor.domain.run import RunState


def preempting(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation) -> Decision:
    """The job shows a PreemptTime (it runs out its GraceTime, or ended in it) and the attempt's
    record does not say so yet: say it. A PreemptTime from before the attempt started is its
    predecessor's (a requeued job shows it until its old incarnation has left)."""
    if job.preempt_time is None or a.preempted_at is not None or job.job_id != a.job_id:
        return Decision()
    if a.started_at is None or job.preempt_time < a.started_at:
        return Decision()
    message = (
        f"Slurm began preempting job {job.job_id} for a higher-priority job: the trainer has the partition's "
        "GraceTime (its SIGTERM) to save; after a verified save the run continues, no restart spent"
    )
    evidence = {"preempt_time": job.preempt_time, "restart_count": job.restart_count}
    event = event_for(run, a, EventKind.NOTE, message, obs, evidence, "preempting")
    return Decision((AttemptPreempted(run.name, a.seq, job.preempt_time), event))


def requeued_after_preemption(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation) -> Decision | None:
    """Slurm requeued the job after preempting it: continued after the grace save; None when it was
    not preempted (the caller's requeue). Without a covering save: the requeue, its restart spent."""
    if a.preempted_at is None:
        return None
    if job.completing:  # its old incarnation is still ending: the trainer may be saving on SIGTERM
        return Decision()
    ended = _ended(run, a, obs)
    as_preempted = JobInfo(job.job_id, job.name, JobState.PREEMPTED, restart_count=a.restart_count)
    continued = continue_after(run, a, as_preempted, obs, PREEMPTED)
    requeue = AttemptRequeued(run.name, job.job_id, job.restart_count, obs.now, tuple(sorted(run.excluded)))
    if continued is None:
        return Decision(ended) + _unsaved(run, a, job, obs, requeue)
    if continued.resubmit is None:  # blocked: the requeued job must not train again
        return Decision(ended) + continued.decision + Decision(actions=(Cancel(run.name, job.job_id, "blocked"),))
    queued = SetState(run.name, RunState.QUEUED, reason=continued.resubmit)
    return Decision(ended) + continued.decision + Decision((requeue, queued))


def requeued_again(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation) -> Decision | None:
    """Slurm 24.11 requeues a job it preempts twice (restart 0 -> 1 -> 2): the incarnation the
    preemption's continuation queued is requeued again before it was ever seen running. Still the
    one preemption, already continued: the new restart count is followed, no restart spent, no
    line. None when the attempt ran or its predecessor was not a continued preemption."""
    before = [p for p in obs.history.get(run.name, ()) if p.seq == a.seq - 1]
    if a.started_at is not None or not before or before[0].job_id != a.job_id:
        return None
    if before[0].end_state != "PREEMPTED" or before[0].continued_with is None:
        return None
    ended = AttemptEnded(run.name, a.seq, obs.now, "PREEMPTED", "requeued again by Slurm before it ran")
    requeue = AttemptRequeued(run.name, job.job_id, job.restart_count, obs.now, tuple(sorted(run.excluded)))
    return Decision((ended, requeue, SetState(run.name, RunState.QUEUED)))


def _unsaved(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation, requeue: AttemptRequeued) -> Decision:
    """Requeued after a preemption without a covering save: the requeue, one restart spent, its
    lost work on record (from the newest verified checkpoint) and the line that says how."""
    as_preempted = JobInfo(job.job_id, job.name, JobState.PREEMPTED, restart_count=a.restart_count)
    hint = unsaved_hint(run, a, as_preempted, obs, PREEMPTED)
    saved = obs.saved.get(run.name)
    evidence = {
        "state": "PREEMPTED",
        "state_reason": job.state_reason,
        "last_step": a.last_step,
        "resume_step": saved.step if saved is not None else None,  # the work since is lost
    }
    message = f"Slurm requeued job {job.job_id} (restart {job.restart_count}): it {hint}"
    event = event_for(run, a, EventKind.REQUEUED, message, obs, evidence)
    return Decision((requeue, SetState(run.name, RunState.QUEUED, spend_restart=True), event))


def _ended(run: RunRecord, a: AttemptRecord, obs: Observation) -> tuple[Record, ...]:
    if a.ended_at is not None:
        return ()
    return (AttemptEnded(run.name, a.seq, obs.now, "PREEMPTED", "preempted, then requeued by Slurm"),)
