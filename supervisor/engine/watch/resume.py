"""What a new attempt is handed: the checkpoint to resume from (and the rollback it carries
out), after passing over one the newest attempts keep failing to resume from.

Reads the checkpoint ledger, the rollbacks and the attempts from the store; the decisions are the
domain's (``choose_resume``, ``failed_load_demotion``, ``pending_rollback``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

import structlog

from supervisor.domain.actions import CheckpointDemoted, Record
from supervisor.domain.checkpoints.demotion import Demotion, Kept, LoadFailureRule, Standing, failed_load_demotion
from supervisor.domain.checkpoints.manifest import Outcome, ResumeChoice, VerifyResult, choose_resume, effective_result
from supervisor.domain.checkpoints.resume import ResumePlan, RollbackRef, resume_plan
from supervisor.domain.records import AttemptRecord, Event, EventKind, RunRecord
from supervisor.domain.spikes.rollback import RollbackRecord, pending_rollback, skip_ranges
from supervisor.engine.watch.spikes import RollbackReads, rollback_history
from supervisor.ports import CheckpointLedger

log = structlog.get_logger("supervisor.checkpoints")


class LoadFailureReads(CheckpointLedger, Protocol):
    """What judging failed loads reads: the checkpoint ledger, and the attempts (what their logs showed)."""

    def attempts(self, run: str, last: int | None = None) -> list[AttemptRecord]: ...


def plan_for(run: RunRecord, store: RollbackReads, recent: int, resume_file: str | None) -> ResumePlan:
    """The newest verified checkpoint (before the planned rollback's onset, if one is pending),
    with every rollback's skip range and the latest LR scale in force."""
    history = rollback_history(store, run.name)
    pending = pending_rollback(history, run.attempt.seq if run.attempt else None)
    choice = choose(run, store, recent, before_step=pending.checkpoint_step if pending else None)
    plan = resume_plan(choice, file=resume_file)
    if history:  # every skip range stays in force: a later restart may resume before one
        plan = replace(plan, skip_iterations=skip_ranges(history), lr_scale=history[-1].lr_scale)
    if pending:
        plan = replace(plan, rollback=_rollback_ref(pending))
    return plan


def choose(run: RunRecord, store: CheckpointLedger, recent: int, before_step: int | None = None) -> ResumeChoice:
    rows = store.checkpoints(run.name, None if before_step is not None else recent)
    refs = [ref for ref, *_ in rows]
    results: dict[str, VerifyResult] = {}
    for ref, meta, full, demoted in rows:
        eff = effective_result(meta, full)
        if demoted and eff is not None:
            eff = VerifyResult(ref.location, ref.step, eff.level, Outcome.CORRUPT, demoted, ref.guarantee)
        if eff is not None:
            results[ref.location] = eff
    policy = run.spec.checkpoints
    return choose_resume(refs, results, before_step=before_step, allow_weak=policy.allow_adopted if policy else True)


def demote_failed_loads(run: RunRecord, store: LoadFailureReads, recent: int, now: float) -> list[Record]:
    """Pass over (demote, in the ledger) the checkpoint the newest attempts keep failing to load:
    the records that say so, or the logbook line saying why it is kept (none when the attempts do
    not keep failing on one). The decision is ``domain.checkpoints.demotion``'s, over the attempts (the steps
    and load failures their logs showed), the plans they were handed and the checkpoints on record
    — all read back from the store, so a daemon restart changes nothing."""
    rule = LoadFailureRule()
    plans = store.resume_plans(run.name, rule.attempts_to_read)
    handed = {seq: plan.chosen.location for seq, plan in plans.items() if plan.chosen is not None}
    attempts = store.attempts(run.name, rule.attempts_to_read)
    decision = failed_load_demotion(attempts, handed, _standings(run, store, recent), run.excluded, rule)
    if decision is None:
        return []
    a = attempts[-1]
    if isinstance(decision, Kept):
        log.info("checkpoint_kept", run=run.name, location=decision.location, why=decision.why)
        return [_kept_event(run, a, decision, now)]
    log.warning("checkpoint_demoted", run=run.name, location=decision.location, why=decision.why)
    return [CheckpointDemoted(run.name, decision.location, decision.why), _demoted_event(run, a, decision, now)]


def _standings(run: RunRecord, store: CheckpointLedger, recent: int) -> list[Standing]:
    out = []
    for ref, meta, full, demoted in store.checkpoints(run.name, recent):
        eff = effective_result(meta, full)
        verified = eff is not None and eff.outcome is Outcome.VERIFIED
        out.append(Standing(ref.location, ref.step, verified, passed_over=demoted is not None))
    return out


def _demoted_event(run: RunRecord, a: AttemptRecord, demotion: Demotion, now: float) -> Event:
    return Event(
        run=run.name,
        kind=EventKind.WARNING,
        message=f"checkpoint {demotion.location} passed over: {demotion.why}",
        key=f"{run.name}:ckpt-demoted:{demotion.location}",
        at=now,
        attempt=a.seq,
        job_id=a.job_id,
        evidence={"location": demotion.location, "failures": list(demotion.streak)}
        | ({"load_failed": demotion.evidence} if demotion.evidence is not None else {}),
    )


def _kept_event(run: RunRecord, a: AttemptRecord, kept: Kept, now: float) -> Event:
    return Event(
        run=run.name,
        kind=EventKind.WARNING,
        message=f"checkpoint {kept.location} kept: {kept.why}",
        key=f"{run.name}:ckpt-kept:{kept.location}",
        at=now,
        attempt=a.seq,
        job_id=a.job_id,
        evidence={"location": kept.location, "failures": list(kept.streak), "passed_over": list(kept.unbacked)},
    )


def _rollback_ref(pending: RollbackRecord) -> RollbackRef:
    """The rollback planned for the attempt being replaced, as the resume plan carries it."""
    assert pending.checkpoint_step is not None  # a planned rollback always names its checkpoint
    return RollbackRef(
        onset_step=pending.onset_step,
        checkpoint_step=pending.checkpoint_step,
        skip=pending.skip.as_megatron() if pending.skip is not None else "",
    )
