"""A job found CANCELLED: a person's scancel (the run ends, naming them when Slurm's accounting
does), or Slurm's own cancel of a job whose prolog failed its launch (the nodes it drained kept
out, the run restarted). Pure. Split from ``lifecycle``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from supervisor.domain.actions import Cancel, Decision, SetState
from supervisor.domain.cluster import JobInfo
from supervisor.domain.decide.faults import recover
from supervisor.domain.observation import Observation, Policy, event_for
from supervisor.domain.records import AttemptRecord, EventKind, RunRecord
from supervisor.domain.run import RunState


def cancelled(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation, policy: Policy) -> Decision:
    failed_on = _launch_failed_on(job, obs)
    if failed_on:  # not a person's cancel: Slurm ended a job it could not requeue (--no-requeue)
        return recover_finished(run, a, job, failed_on, obs, policy)
    if _just_launched(job) and obs.now - (job.end_time or obs.now) < LAUNCH_WINDOW_S:
        return Decision()  # cancelled as it started: give Slurm a moment to show a prolog's drain
    return _cancelled_by_hand(run, job, obs)


def _cancelled_by_hand(run: RunRecord, job: JobInfo, obs: Observation) -> Decision:
    """A person cancelled the job (scancel): the run ends, and the logbook names them when Slurm's
    accounting did (``job.cancelled_by``), else says Slurm did not — never blames the supervisor."""
    who = job.cancelled_by
    if who is None:
        why = f"job {job.job_id} was cancelled outside the supervisor, by someone Slurm did not name; not restarting"
        evidence: dict[str, object] = {"cancelled_by_uid": None}
    else:
        why = f"job {job.job_id} was cancelled by {who} outside the supervisor; not restarting"
        evidence = {"cancelled_by_uid": who.uid, "cancelled_by": who.name or None}
    event = event_for(run, run.attempt, EventKind.CANCELLED, why, obs, evidence)
    actor = who.actor if who is not None else "unknown"
    return Decision((SetState(run.name, RunState.CANCELLED, reason=why), replace(event, actor=actor)))


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


def recover_finished(
    run: RunRecord, a: AttemptRecord, job: JobInfo, bad: Mapping[str, str], obs: Observation, policy: Policy
) -> Decision:
    decision = recover(run, a, job, bad, obs, policy)
    actions = tuple(x for x in decision.actions if not isinstance(x, Cancel))
    return Decision(decision.records, actions)
