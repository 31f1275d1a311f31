"""A planned end of a job: a week-long run on a partition with a time limit is a chain of jobs. Pure.

A job ends on purpose when it reaches its time limit (TIMEOUT), is preempted (PREEMPTED: after the
partition's GraceTime, whose SIGTERM the trainer saves on), exits with the continue code
(``exit_codes``: "saved, continue me"), or exits 0 below the run's target step (Megatron's
``--exit-duration-in-mins``). Such an end after a verified save — the newest verified checkpoint at
or past the last step the job's log showed — is **continued**: the next job resumes from that
checkpoint, no restart is spent, goodput books no interruption (a continuation line of its own),
the logbook line is routine and nothing pages. Without such a save it is a fault like any other,
and its line says how to make it a continuation.

Bounded: the continuations are on record per attempt (``AttemptRecord.continued_with``, in the
store). When the attempts before this one were continued ``max_without_progress`` times in a row
from the very checkpoint this end would continue from — a time limit shorter than the start-up, a
trainer that never saves — the run is blocked with one page instead of looping.

"Unverifiable" is not "corrupt": when the save that would cover the job's work is committed but
storage would not let it be checked (a 503, a timeout, a root that cannot be listed), the end is
neither continued nor a fault yet: ``wait_for_save`` holds the decision and the save is checked
again each tick, for ``SAVE_CHECK_WAIT_S`` after the job's end; then it is a fault whose line says
that storage did not answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.domain.actions import AttemptContinued, Decision
from supervisor.domain.cluster import JobInfo, JobState
from supervisor.domain.decide.exit_codes import meaning_of
from supervisor.domain.observation import Observation, SavedCheckpoint, UncheckedSave, event_for, set_terminal
from supervisor.domain.records import AttemptRecord, EventKind, RunRecord
from supervisor.domain.run import ContinuationPolicy, ExitMeaning, RunState

DEFAULT = ContinuationPolicy()
# How long a planned end waits on a save storage will not let be checked. Below Slurm's default
# MinJobAge (300 s), so the ended job is still in squeue when the wait ends, even without slurmdbd.
SAVE_CHECK_WAIT_S = 180.0
PREEMPTED = "was preempted (a higher-priority job took its nodes)"


@dataclass(frozen=True)
class Continued:
    """What a planned end after a verified save asks: its records, and why the next job is submitted
    (None: the chain is blocked, the decision ends the run)."""

    decision: Decision
    resubmit: str | None


def planned_end(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation) -> str | None:
    """How the job ended on purpose, for the logbook; None when it did not. A preemption counts:
    with the partition's GraceTime the trainer had SIGTERM to save on, like a time limit's signal."""
    preempted = a.preempted_at is not None or job.preempt_time is not None
    if job.state is JobState.PREEMPTED or (preempted and job.state is not JobState.CANCELLED):
        return PREEMPTED  # or it ended by itself in its GraceTime (the trainer saved and exited)
    if job.state is JobState.TIMEOUT:
        return "reached its time limit"
    if job.state is JobState.CANCELLED:
        return None  # a person's cancel, or Slurm's after a launch failure: never a continuation
    if meaning_of(run.spec, job.exit_code) is ExitMeaning.CONTINUE:
        return f"exited with the continue code {job.exit_code}"
    target = run.spec.continuation.target_step if run.spec.continuation is not None else None
    reached = _reached(a, obs.saved.get(run.name))
    if job.state is JobState.COMPLETED and not job.exit_code and target is not None and reached is not None:
        return f"exited 0 at step {reached}, below the run's target step {target}" if reached < target else None
    return None


def _reached(a: AttemptRecord, saved: SavedCheckpoint | None) -> int | None:
    """The step the job got to: its log's, else its newest checkpoint's."""
    if a.last_step is not None:
        return a.last_step
    return saved.step if saved is not None else None


def continue_after(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation, how: str) -> Continued | None:
    """The planned end continued (or the chain blocked); None when no verified save covers the
    job's work: the caller books it as a fault, with ``unsaved_hint``."""
    saved = obs.saved.get(run.name)
    if saved is None or not _covers(saved, a):
        return None
    policy = run.spec.continuation or DEFAULT
    in_a_row = _continued_from(run, a, saved, obs)
    if in_a_row >= policy.max_without_progress:
        return Continued(_blocked(run, job, saved, in_a_row, obs), None)
    step = "" if saved.step is None else f" at step {saved.step}"
    message = f"job {job.job_id} {how} after a verified save{step}; the next job continues from it (no restart spent)"
    evidence = {
        "how": how,
        "state": job.state.value,
        "exit_code": job.exit_code,
        "checkpoint": saved.location,
        "resume_step": saved.step,
        "last_step": a.last_step,
        "lost_steps": 0,
    }
    records = (
        AttemptContinued(run.name, a.seq, saved.location),
        event_for(run, a, EventKind.CONTINUED, message, obs, evidence),
    )
    return Continued(Decision(records), f"continuation: {how}{step}")


def _covers(saved: SavedCheckpoint, a: AttemptRecord) -> bool:
    """The checkpoint holds the job's work: at or past the last step its log showed."""
    return a.last_step is None or saved.step is None or saved.step >= a.last_step


def _continued_from(run: RunRecord, a: AttemptRecord, saved: SavedCheckpoint, obs: Observation) -> int:
    """How many attempts just before this one were continued from this very checkpoint."""
    count = 0
    for earlier in sorted(obs.history.get(run.name, ()), key=lambda h: h.seq, reverse=True):
        if earlier.seq >= a.seq:
            continue
        if earlier.continued_with != saved.location:
            break
        count += 1
    return count


def _blocked(run: RunRecord, job: JobInfo, saved: SavedCheckpoint, in_a_row: int, obs: Observation) -> Decision:
    why = (
        f"blocked: job {job.job_id} would be continuation {in_a_row + 1} in a row from {saved.location} with no newer "
        "verified checkpoint: the jobs end before they save anew (a time limit shorter than the start-up and the "
        "save, or a trainer that never saves before it ends). Raise the job's --time or the trainer's save on "
        "the signal ([continuation] in docs/configuration.md), then submit the run again"
    )
    return set_terminal(run, RunState.FAILED, EventKind.GAVE_UP, why, obs)


def wait_for_save(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation, how: str) -> Decision | None:
    """A planned end whose covering save could not be checked: hold (one logbook line), and decide
    again next tick; None when there is nothing to wait on, or the wait is over."""
    unchecked = _unchecked_cover(run, a, obs)
    until = _ended(a, job, obs) + SAVE_CHECK_WAIT_S
    if unchecked is None or obs.now >= until:
        return None
    what = "the save" if unchecked.step is None else f"the save at step {unchecked.step}"
    message = (
        f"job {job.job_id} {how}; {what} is unverifiable for now ({unchecked.reason}): waiting up to "
        f"{SAVE_CHECK_WAIT_S:.0f} s for storage before deciding (unverifiable is not corrupt)"
    )
    evidence = {"checkpoint": unchecked.location, "step": unchecked.step, "reason": unchecked.reason, "until": until}
    event = event_for(run, a, EventKind.WARNING, message, obs, evidence, "save-check")
    return Decision((event,), recheck_at=until)


def _unchecked_cover(run: RunRecord, a: AttemptRecord, obs: Observation) -> UncheckedSave | None:
    """The unchecked save, when it may hold the job's work (a root not listed may hold anything)."""
    unchecked = obs.unchecked.get(run.name)
    if unchecked is None or unchecked.step is None or a.last_step is None or unchecked.step >= a.last_step:
        return unchecked
    return None


def _ended(a: AttemptRecord, job: JobInfo, obs: Observation) -> float:
    if a.ended_at is not None:
        return a.ended_at
    return job.end_time if job.end_time is not None else obs.now


def unsaved_hint(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation, how: str) -> str:
    """For the fault line of a planned end without a save: what was missing, and how to make the
    next one a continuation."""
    unchecked = _unchecked_cover(run, a, obs)
    if unchecked is not None:
        what = "the save" if unchecked.step is None else f"the save at step {unchecked.step}"
        return (
            f"{how}; {what} could not be verified within {SAVE_CHECK_WAIT_S:.0f} s ({unchecked.reason}): storage did "
            "not answer, so the run restarts from the newest verified checkpoint (nothing was marked bad)"
        )
    saved = obs.saved.get(run.name)
    newest = "no verified checkpoint" if saved is None else f"the newest verified checkpoint is step {saved.step}"
    missing = f"{how} without a verified save at or past step {a.last_step} ({newest})"
    if run.spec.checkpoints is None:
        return f"{missing}; to continue such ends instead, give the run [checkpoints] and [continuation] (docs/configuration.md)"
    if job.state is JobState.PREEMPTED:
        return (
            f"{missing}; a preemption is continued when the trainer saves on the grace signal: the partition's "
            "GraceTime makes Slurm send SIGTERM that long before it kills the job, and the trainer must save, commit "
            "and exit on it (docs/trainer-integration.md)"
        )
    policy = run.spec.continuation
    if policy is None or policy.signal is None:
        return (
            f'{missing}; to make it a continuation, add [continuation] (signal = "USR1", lead_s = 600: the '
            "supervisor asks Slurm for --signal=B:USR1@600) and have the trainer save and exit on that signal "
            "(docs/recipes.md)"
        )
    return (
        f"{missing}; the trainer had SIG{policy.signal} {policy.lead_s} s before the limit ([continuation] signal): "
        "it must save, commit and exit with the continue code on it (docs/trainer-integration.md), or lead_s must "
        "leave the save time"
    )
