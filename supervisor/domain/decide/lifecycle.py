"""Decisions on a job that is queued, requeued by Slurm, finished or gone: exclusions kept
current, launch-failure holds released, outcomes understood, restarts within the budget, where the
next job may go. Pure."""

from __future__ import annotations

from dataclasses import replace

from supervisor.domain.actions import (
    Action,
    AttemptEnded,
    AttemptRequeued,
    AttemptStarted,
    Cancel,
    Decision,
    Fence,
    Record,
    Release,
    SetExcluded,
    SetState,
    Submit,
)
from supervisor.domain.cluster import JobHold, JobInfo, JobState
from supervisor.domain.decide.backoff import Backoff, restart_backoff
from supervisor.domain.decide.cancelled import cancelled, recover_finished
from supervisor.domain.decide.continuation import continue_after, planned_end, unsaved_hint, wait_for_save
from supervisor.domain.decide.exit_codes import meaning_of, run_elsewhere
from supervisor.domain.decide.faults import contain, faulty_nodes
from supervisor.domain.decide.forgotten import read_from_accounting, unknown_outcome, wait_for_accounting
from supervisor.domain.decide.placement import Placement, place, placement_notes
from supervisor.domain.decide.preempted import requeued_after_preemption, requeued_again
from supervisor.domain.decide.prequeue import start_successor
from supervisor.domain.observation import (
    Observation,
    Policy,
    event_for,
    fmt_nodes,
    set_terminal,
)
from supervisor.domain.records import AttemptRecord, EventKind, RunRecord
from supervisor.domain.run import ExitMeaning, RestartMode, RunState


def decide_pending(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation, policy: Policy) -> Decision:
    """A queued job: its exclude list follows the nodes' state every tick (a node back in service
    is dropped from it, a node newly bad added), and a job that cannot be placed says why."""
    records: list[Record] = []
    actions: list[Action] = []
    if run.state in (RunState.REGISTERED, RunState.RUNNING, RunState.RECOVERING):
        records.append(SetState(run.name, RunState.QUEUED))
    placement = place(run, obs.snapshot, obs.quarantined, policy.when_short, current=job.excluded_nodes)
    if placement.submittable and set(placement.exclude) != set(job.excluded_nodes):
        actions.append(SetExcluded(run.name, job.job_id, placement.exclude))
    if job.hold is JobHold.LAUNCH_FAILED or _held_after_our_prolog(run, job):
        actions.append(Release(run.name, job.job_id, f"Slurm held the job after a launch failure ({job.state_reason})"))
    notes = placement_notes(run, a, placement, a.submitted_at, obs.now, policy.stuck_page_s)
    return Decision(tuple(records) + notes.events, tuple(actions), notes.recheck_at, waiting=placement.short)


def submit_next(
    run: RunRecord,
    a: AttemptRecord | None,
    obs: Observation,
    policy: Policy,
    *,
    restart: bool,
    reason: str,
    since: float,
) -> Decision:
    """Submit the run's next job where it can be placed. When Slurm would refuse every exclude
    list (nodes in service that must stay out leave the partition too small), nothing is
    submitted: the run waits, says for which nodes, and is looked at again every tick."""
    refused = obs.refused.get(run.name, ())
    if len(refused) >= 2:
        return _blocked(run, refused[-1][1], obs)
    if refused and obs.now < refused[-1][0] + REFUSAL_RETRY_S:  # once more, after a minute
        return Decision(recheck_at=refused[-1][0] + REFUSAL_RETRY_S, waiting=True)
    placement = place(run, obs.snapshot, obs.quarantined, policy.when_short)
    notes = placement_notes(run, a, placement, since, obs.now, policy.stuck_page_s, waiting=not placement.submittable)
    if not placement.submittable:
        return Decision(notes.events, (), notes.recheck_at, waiting=True)
    hot, reason = _hot_spares_for(run, placement, reason)
    submit = Submit(run.name, placement.exclude, restart=restart, reason=reason, hot_spares=hot)
    return Decision(notes.events, (submit,), notes.recheck_at)


def _hot_spares_for(run: RunRecord, placement: Placement, reason: str) -> tuple[int | None, str]:
    """In-allocation mode: as many hot spares as the usable nodes leave room for beyond the run's
    (Slurm refuses a job asking for more nodes than its exclude list leaves); the reason says when
    fewer than the spec's. None outside in-allocation mode."""
    spec = run.spec
    if spec.restart_mode is not RestartMode.IN_ALLOCATION:
        return None, reason
    hot = max(0, min(spec.hot_spares, placement.usable - spec.nodes))
    if hot < spec.hot_spares:
        reason = f"{reason}; with {hot} of {spec.hot_spares} hot spare(s): {placement.usable} usable node(s)"
    return hot, reason


REFUSAL_RETRY_S = 60.0  # after Slurm refuses a submission for good: one more try after this long


def _blocked(run: RunRecord, error: str, obs: Observation) -> Decision:
    """Slurm refused the submission twice, a minute apart (an error that is not the controller
    being unreachable; once could be a partition being reconfigured): the run is blocked — it
    ends, pages once, and the logbook names Slurm's error and the fix. Never a loop of sbatch."""
    why = (
        f"blocked: Slurm refuses the run's job ({error}); not retrying. Fix the spec (or the cluster) and submit "
        "it under a new name; `slurm-supervisor submit` checks a spec against Slurm first"
    )
    return set_terminal(run, RunState.FAILED, EventKind.GAVE_UP, why, obs)


def _held_after_our_prolog(run: RunRecord, job: JobInfo) -> bool:
    """The prolog's failure and this run's own drain of the same node race: Slurm may then keep the
    launch-failure hold as an admin's hold and lose its description. The hold is ours to lift when
    the requeued incarnation's fault was a prolog finding on a node this run excluded for it; a
    person's hold (USER, or ADMIN without that fault) is kept."""
    return (
        job.restart_count > 0 and job.hold is JobHold.ADMIN and any("[prolog" in why for why in run.excluded.values())
    )


def decide_requeued(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation, policy: Policy) -> Decision:
    bad = faulty_nodes(run, a.nodes, obs)
    preempted = None if bad else requeued_after_preemption(run, a, job, obs)
    if preempted is None and not bad:  # 24.11: requeued again before it ran, the same preemption
        preempted = requeued_again(run, a, job, obs)
    if preempted is not None:  # a higher-priority job took the nodes: continued after the grace save
        return preempted
    records: list[Record] = []
    if a.ended_at is None:
        records.append(
            AttemptEnded(
                run.name, a.seq, obs.now, "REQUEUED", f"requeued by Slurm ({job.state_reason or 'no reason given'})"
            )
        )
    contained, actions = contain(run, a, bad, obs, policy)
    records += contained
    excluded = tuple(sorted(set(run.excluded) | set(bad)))
    records += [
        AttemptRequeued(run.name, job.job_id, job.restart_count, obs.now, excluded),
        SetState(run.name, RunState.QUEUED, spend_restart=True),
        event_for(
            run,
            a,
            EventKind.REQUEUED,
            f"Slurm requeued job {job.job_id} (restart {job.restart_count})",
            obs,
            {"state_reason": job.state_reason, "bad_nodes": dict(bad)},
        ),
    ]
    return Decision(tuple(records), tuple(actions))


def decide_finished(
    run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation, policy: Policy, how: str | None = None
) -> Decision:
    """The job ended (``how``: what is left of it when Slurm is still completing it): record how,
    then restart, finish the run, or find out why it ended."""
    done = Decision(tuple(_ended_records(run, a, job, obs, how)))
    if run.state is RunState.RECOVERING:
        rollback = obs.rollbacks.get(run.name)
        why = (
            f"rollback to step {rollback.checkpoint_step} after the loss spike at step {rollback.onset_step}"
            if rollback
            else "replacing the incarnation stopped after a fault"
        )
        why = f"{why}; {how}" if how else why
        return done + _restart(run, a, job, obs, policy, why, deliberate=rollback is not None)
    how = planned_end(run, a, job, obs)
    if how is not None:  # on purpose: continued after a verified save, else a fault that says how
        return done + _planned(run, a, job, obs, policy, how)
    meaning = meaning_of(run.spec, job.exit_code)
    if job.state is JobState.COMPLETED and (job.exit_code or 0) == 0:
        return done + set_terminal(run, RunState.COMPLETED, EventKind.COMPLETED, f"job {job.job_id} completed", obs)
    if meaning is ExitMeaning.STOP:
        why = f"job {job.job_id} exited with do-not-restart code {job.exit_code}; not restarting"
        return done + set_terminal(run, RunState.FAILED, EventKind.GAVE_UP, why, obs)
    if job.state is JobState.CANCELLED:
        return done + cancelled(run, a, job, obs, policy)
    if meaning is ExitMeaning.RESTART_ELSEWHERE:
        return done + run_elsewhere(run, a, job, obs)
    return done + _died(run, a, job, obs, policy)


def _planned(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation, policy: Policy, how: str) -> Decision:
    continued = continue_after(run, a, job, obs, how)
    held = wait_for_save(run, a, job, obs, how) if continued is None else None
    if held is not None:  # the save could not be checked yet: unverifiable is not corrupt
        return held
    if continued is None:
        return _died(run, a, job, obs, policy, unsaved_hint(run, a, job, obs, how))
    if continued.resubmit is None:
        return continued.decision
    started = start_successor(run, a, obs, policy, continued.resubmit)
    if started is not None:  # pre-queued before the end: released now, from the checkpoint as of now
        return continued.decision + started
    since = a.ended_at if a.ended_at is not None else (job.end_time or obs.now)
    return continued.decision + submit_next(run, a, obs, policy, restart=False, reason=continued.resubmit, since=since)


def _ended_records(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation, how: str | None) -> list[Record]:
    records: list[Record] = [*read_from_accounting(run, a, job, obs), *_started_unseen(run, a, job, obs)]
    if a.ended_at is None:
        reason = job.state_reason or job.state.value
        records.append(AttemptEnded(run.name, a.seq, job.end_time or obs.now, job.state.value, reason, job.exit_code))
    if run.state is RunState.RECOVERING:
        how = (
            f"ended {job.state.value} after the fault"
            if how is None
            else f"is gone but for what Slurm completes: {how}"
        )
        evidence = {"state": job.state.value, "exit_code": job.exit_code, "nodes": list(job.nodes)}
        records.append(event_for(run, a, EventKind.STOPPED, f"{a.label} {how}", obs, evidence, str(job.job_id)))
    return records


def _started_unseen(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation) -> list[Record]:
    """An attempt that started and ended between two polls: its start, from Slurm's start time
    (the logbook and goodput book its run time as run time, not as queue time)."""
    if a.started_at is not None or job.start_time is None:
        return []
    message = f"{a.label} ran on {fmt_nodes(job.nodes)} (started and ended between two polls)"
    started = event_for(run, a, EventKind.STARTED, message, obs, {"nodes": list(job.nodes), "seen_running": False})
    return [AttemptStarted(run.name, a.seq, job.nodes, job.start_time), replace(started, at=job.start_time)]


def _died(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation, policy: Policy, hint: str = "") -> Decision:
    """The job ended unsuccessfully by itself: a node fault, or a fault of the job (``hint``: a
    planned end without a save, and how to make it a continuation)."""
    bad = faulty_nodes(run, a.nodes or job.nodes, obs)
    if bad:
        return recover_finished(run, a, job, bad, obs, policy)
    ended = job.end_time or obs.now
    if (
        policy.evidence_wait_s > 0
        and set(a.nodes or job.nodes) & obs.agents
        and obs.now < ended + policy.evidence_wait_s
    ):
        # A GPU fault kills the job at once; the node's agent says which node at its next sample.
        # Restarting before that would put the run back on the broken node: wait that long.
        return Decision(recheck_at=ended + policy.evidence_wait_s)
    why = f"job {job.job_id} ended {job.state.value}" + (f" with exit code {job.exit_code}" if job.exit_code else "")
    why = f"{why}: {hint}" if hint else why
    evidence = {
        "state": job.state.value,
        "exit_code": job.exit_code,
        "state_reason": job.state_reason,
        "detection_s": round(max(0.0, obs.now - ended), 1),  # from Slurm's end time to this decision
    }
    fault = event_for(run, a, EventKind.FAULT, why, obs, evidence)
    return Decision((fault, SetState(run.name, RunState.RECOVERING, reason=why)))


def _restart(
    run: RunRecord,
    a: AttemptRecord,
    job: JobInfo | None,
    obs: Observation,
    policy: Policy,
    reason: str,
    *,
    deliberate: bool = False,
) -> Decision:
    """Submit the next attempt (after fencing, a storm's settling and a fast failure's backoff).
    ``deliberate``: the supervisor stopped the attempt itself though it was training (a rollback):
    that is no failure, fast or not, and the restart does not wait."""
    if run.restarts_spent >= run.spec.max_restarts:
        why = f"restart budget spent ({run.restarts_spent} of {run.spec.max_restarts}); giving up"
        return set_terminal(run, RunState.FAILED, EventKind.GAVE_UP, why, obs)
    actions: list[Action] = []
    records: list[Record] = []
    dead = sorted(n for n in set(a.nodes) & set(run.excluded) if _unreachable(obs, n))
    if policy.fence and job is not None:
        actions += [Fence(run.name, n, a.job_id) for n in dead]
    elif dead:
        msg = (
            f"no fence command: cannot confirm that nothing of {a.label} still runs on {fmt_nodes(tuple(dead))}; "
            "Slurm kills leftovers when the node's slurmd returns (set fence.command to power it off)"
        )
        records.append(event_for(run, a, EventKind.WARNING, msg, obs, {"nodes": dead}, "unfenced"))
    since = a.ended_at if a.ended_at is not None else obs.now
    fenced = Decision(tuple(records), tuple(actions))
    # Nodes of the ended attempt found faulty since it ended (an agent's XID after the job died,
    # the rest of a storm): kept out now, not found again on the next attempt.
    newly = {n: why for n, why in faulty_nodes(run, a.nodes, obs).items() if n not in run.excluded}
    if newly:
        more, drains = contain(run, a, newly, obs, policy)
        fenced = fenced + Decision(tuple(more), tuple(drains))
        run = replace(run, excluded={**run.excluded, **newly})
    if policy.storm and obs.now < since + STORM_SETTLE_S:
        return fenced + _settle(run, a, since, obs)
    kept_out = {*run.excluded, *run.deferred}  # an attempt on one of them ended for it, not fast by itself
    history = _history(run, a, job, obs)
    backoff = None if deliberate else restart_backoff(run.name, history, run.spec.pacing, kept_out)
    if backoff is not None and obs.now < backoff.until:
        return fenced + _wait_to_restart(run, a, backoff, obs)
    return fenced + submit_next(run, a, obs, policy, restart=True, reason=reason, since=since)


STORM_SETTLE_S = 120.0  # in a storm (the blast radius spent), wait this long for the rest to show


def _settle(run: RunRecord, a: AttemptRecord, since: float, obs: Observation) -> Decision:
    """More nodes faulted than the blast radius allows within the hour: a storm. Restarting at once
    would land on nodes about to fail; wait a little for the rest of the storm to show."""
    until = since + STORM_SETTLE_S
    message = (
        f"next restart in {until - obs.now:.0f} s: the blast radius is spent (a storm); waiting for the "
        "rest of the faulting nodes to show before placing the run again"
    )
    event = event_for(run, a, EventKind.BACKOFF, message, obs, {"until": until, "storm": True}, "storm")
    return Decision((event,), recheck_at=until, waiting=True)


def _history(run: RunRecord, a: AttemptRecord, job: JobInfo | None, obs: Observation) -> list[AttemptRecord]:
    """The run's newest attempts, the one just replaced as it ended (its end may be recorded in
    this very decision)."""
    end_state = a.end_state or (job.state.value if job is not None else "VANISHED")
    ended = replace(a, ended_at=a.ended_at or (job.end_time if job and job.end_time else obs.now), end_state=end_state)
    return [h for h in obs.history.get(run.name, ()) if h.seq != a.seq] + [ended]


def _wait_to_restart(run: RunRecord, a: AttemptRecord, backoff: Backoff, obs: Observation) -> Decision:
    """Not yet: the logbook says how long and why (once per attempt); a crash loop pages once."""
    evidence = {"delay_s": round(backoff.delay_s, 1), "until": backoff.until, "fast_failures": backoff.fast_failures}
    message = f"next restart in {backoff.delay_s:.0f} s ({backoff.why})"
    records: list[Record] = [event_for(run, a, EventKind.BACKOFF, message, obs, evidence)]
    if backoff.crash_loop:
        first = a.seq - backoff.fast_failures + 1  # the crash loop's first attempt: one page per loop
        pause = f"crash loop: paused for {backoff.delay_s / 60:.0f} min before each restart ({backoff.why})"
        key = f"{run.name}:crash_loop:{first}"
        records.append(replace(event_for(run, a, EventKind.CRASH_LOOP, pause, obs, evidence), key=key))
    return Decision(tuple(records), recheck_at=backoff.until, waiting=True)


def _unreachable(obs: Observation, node: str) -> bool:
    """Slurm cannot reach the node: what runs there cannot be confirmed stopped without a fence.
    A node drained for a GPU fault still answers; its slurmd kills the cancelled job."""
    info = obs.snapshot.nodes.get(node)
    return info is None or info.down or not info.responding or node in obs.dead


def decide_vanished(run: RunRecord, a: AttemptRecord, obs: Observation, policy: Policy) -> Decision:
    """The job is gone from squeue and accounting gave no record of its end (``obs.forgotten``
    says why): a recovering run restarts; otherwise wait while accounting may yet tell, else stop."""
    ended = (
        ()
        if a.ended_at is not None
        else (AttemptEnded(run.name, a.seq, obs.now, "VANISHED", "job no longer known to Slurm"),)
    )
    if run.state is RunState.RECOVERING:
        return Decision(ended) + _restart(run, a, None, obs, policy, "replacing the incarnation stopped after a fault")
    gone = obs.forgotten.get(a.job_id)
    if gone is not None and not gone.final:
        return wait_for_accounting(run, a, gone, obs)
    why = unknown_outcome(a, gone)
    return Decision(ended) + set_terminal(run, RunState.FAILED, EventKind.GAVE_UP, why, obs)


def decide_cancel(run: RunRecord, a: AttemptRecord, job: JobInfo | None, obs: Observation) -> Decision:
    if job is not None and not job.state.finished:
        return Decision(actions=(Cancel(run.name, job.job_id, "cancel requested"),))
    if job is not None and job.completing:
        return Decision()
    return set_terminal(run, RunState.CANCELLED, EventKind.CANCELLED, "cancelled on request", obs)
