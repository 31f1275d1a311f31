"""What the logbook says of a job Slurm's controller forgot (it ended longer than MinJobAge ago,
e.g. while the daemon was stopped): its outcome read from accounting, the wait while accounting
cannot answer yet, or why the outcome is unknown. Pure."""

from __future__ import annotations

from supervisor.domain.actions import Decision, Record
from supervisor.domain.cluster import JobInfo
from supervisor.domain.observation import Forgotten, Observation, event_for
from supervisor.domain.records import AttemptRecord, EventKind, RunRecord


def read_from_accounting(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation) -> list[Record]:
    """A NOTE, once per attempt, when the job's end came from accounting instead of squeue."""
    gone = obs.forgotten.get(job.job_id)
    if gone is None or not gone.found or a.ended_at is not None:
        return []
    how = f"signal {job.term_signal}" if job.term_signal is not None else f"exit code {job.exit_code}"
    how = "no exit code" if job.term_signal is None and job.exit_code is None else how
    message = (
        f"job {job.job_id} ended {job.state.value} ({how}) while nobody watched: Slurm's controller no longer "
        f"lists it (MinJobAge passed); {gone.why}"
    )
    evidence = {
        "source": "sacct",
        "state": job.state.value,
        "exit_code": job.exit_code,
        "term_signal": job.term_signal,
        "end_time": job.end_time,
        "restart_count": job.restart_count,
        "nodes": list(job.nodes),
    }
    return [event_for(run, a, EventKind.NOTE, message, obs, evidence, "accounting")]


def wait_for_accounting(run: RunRecord, a: AttemptRecord, gone: Forgotten, obs: Observation) -> Decision:
    """Accounting may yet tell (slurmdbd unreachable, the end not recorded yet): decide nothing,
    say so once per attempt; the next tick asks again."""
    message = f"job {a.job_id} is no longer listed by Slurm's controller; waiting for its outcome: {gone.why}"
    event = event_for(run, a, EventKind.WARNING, message, obs, {"job_id": a.job_id}, "accounting_wait")
    return Decision((event,), recheck_at=obs.now + ACCOUNTING_RETRY_S)


ACCOUNTING_RETRY_S = 30.0  # ask accounting again this soon even when nothing else changes


def unknown_outcome(a: AttemptRecord, gone: Forgotten | None) -> str:
    """Why the run stops: the job's outcome is unknown, and why accounting could not tell."""
    because = f"; {gone.why}" if gone is not None else ""
    return (
        f"job {a.job_id} is no longer known to Slurm and its outcome is unknown (it ended longer than MinJobAge "
        f"ago{because}); not restarting blindly. Check the job's output, then submit the spec under a new run name"
    )
