"""Loss spikes in the tick: log every spike and how it ended; roll back the ones that do not heal.

The detector (domain.spikes.events) runs on each attempt's log inside ProgressWatch. Here its notices
become logbook events — each outcome with the rule that fired (healed, diverged, trend, plateau,
aftershock, not_healed, nonfinite, loss_scale_*), its figures and its decision latency — and an
outcome that asks for a rollback becomes a decision
(domain.spikes.rollback.decide_rollback): the newest verified checkpoint at least M steps before the
onset (for a loss trend: before the climb began), a data-skip range, an LR scale that shrinks on repeats, at most N automatic rollbacks per
window — past that, or without a checkpoint to go back to, a page for a human.

The decision is a typed record (``RollbackRecord``, planned or blocked), returned with its
logbook line for the engine's executor to write in one transaction; the policy stops the job because a planned rollback exists for the
current attempt, and the next submission resumes from the rollback's checkpoint with the skip
ranges and LR scale in its environment (and marks it done). A daemon crash between any two of
these steps loses nothing: the record is in the store. No decision reads the logbook line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

import structlog

from supervisor.domain.actions import Record
from supervisor.domain.checkpoints.manifest import Outcome, effective_result
from supervisor.domain.records import Event, EventKind, RunRecord
from supervisor.domain.spikes.events import Decision, SpikeEvent, SpikeKind, SpikeOutcome
from supervisor.domain.spikes.rollback import (
    RollbackPolicy,
    RollbackRecord,
    RollbackStatus,
    decide_rollback,
    pending_rollback,
)
from supervisor.engine.watch.progress import SpikeNotice, spike_settings
from supervisor.ports import CheckpointLedger, Clock, RollbackLedger

log = structlog.get_logger("supervisor.spikes")


class RollbackReads(RollbackLedger, CheckpointLedger, Protocol):
    """What planning a rollback reads: the rollbacks on record and the verified checkpoints."""


def spike_records(
    notices: Iterable[SpikeNotice],
    runs: Iterable[RunRecord],
    store: RollbackReads,
    clock: Clock,
    refresh: Callable[[RunRecord], object] | None = None,
) -> list[Record]:
    """The records each notice calls for (see the module docstring): logbook lines, and for a
    spike that did not heal the rollback decision. Reads the store, writes nothing. ``refresh(run)``
    brings the run's checkpoint verdicts up to date before a rollback is planned (a checkpoint
    written moments ago may be the right one to go back to)."""
    by_name = {r.name: r for r in runs}
    out: list[Record] = []
    for n in notices:
        run = by_name.get(n.run)
        if run is None or run.attempt is None or (run.attempt.job_id, run.attempt.restart_count) != n.attempt_key:
            continue  # a notice from an attempt that is no longer current
        if isinstance(n.notice, SpikeEvent):
            out.append(_spike_event(run, n, n.notice, clock))
        elif n.notice.decision is Decision.LEAVE:
            out.append(_healed_event(run, n, n.notice, clock))
        else:
            if refresh is not None:
                refresh(run)
            out += _rollback(run, n, n.notice, store, clock)
    return out


def pending_rollbacks(runs: Iterable[RunRecord], store: RollbackLedger) -> dict[str, RollbackRecord]:
    """Runs whose current attempt has a rollback planned and not yet carried out."""
    out: dict[str, RollbackRecord] = {}
    for run in runs:
        a = run.attempt
        pending = pending_rollback(store.rollbacks(run.name), a.seq) if a is not None else None
        if pending is not None:
            out[run.name] = pending
    return out


def rollback_history(store: RollbackLedger, run: str) -> list[RollbackRecord]:
    """Every rollback of the run that was (or is being) carried out, oldest first."""
    return [r for r in store.rollbacks(run) if r.counts]


def _series(n: SpikeNotice) -> list[list[Any]]:
    return [list(point) for point in n.series]


def _spike_event(run: RunRecord, n: SpikeNotice, ev: SpikeEvent, clock: Clock) -> Event:
    a = run.attempt
    assert a is not None
    what = "loss trend" if ev.kind is SpikeKind.TREND else f"{ev.kind.value} spike"
    return Event(
        run.name,
        EventKind.SPIKE,
        f"{what} at step {ev.onset_step}: {ev.reason}",
        f"{run.name}:{a.seq}:spike:{ev.kind.value}:{ev.onset_step}",
        clock.now(),
        a.seq,
        a.job_id,
        evidence={
            "kind": ev.kind.value,
            "onset_step": ev.onset_step,
            "value": ev.value,
            "baseline": ev.baseline,
            "sigma": ev.sigma,
            "z": ev.severity_z,
            "series": _series(n),
        },
    )


def _outcome_evidence(out: SpikeOutcome, n: SpikeNotice) -> dict[str, Any]:
    return {
        "kind": out.event.kind.value,
        "onset_step": out.event.onset_step,
        "status": out.status.value,
        "rule": out.rule,
        "decided_step": out.decided_step,
        "peak_step": out.peak_step,
        "peak_value": out.peak_value,
        "peak_z": out.peak_z,
        "steps_after_onset": out.steps_after_onset,
        "decision_steps": out.steps_after_onset,  # the decision latency, the figure issue 20 reports
        "figures": dict(out.figures),  # the numbers of the rule that fired (plateau, trend, ...)
        "series": _series(n),
    }


def _healed_event(run: RunRecord, n: SpikeNotice, out: SpikeOutcome, clock: Clock) -> Event:
    a = run.attempt
    assert a is not None
    return Event(
        run.name,
        EventKind.SPIKE_HEALED,
        f"spike at step {out.event.onset_step} healed after {out.steps_after_onset} steps; left alone ({out.reason})",
        f"{run.name}:{a.seq}:spike-healed:{out.event.onset_step}",
        clock.now(),
        a.seq,
        a.job_id,
        evidence=_outcome_evidence(out, n),
    )


def _rollback(run: RunRecord, n: SpikeNotice, out: SpikeOutcome, store: RollbackReads, clock: Clock) -> list[Record]:
    """The decision for a spike that did not heal, typed (what later decisions read) and as its
    logbook line (for people)."""
    a = run.attempt
    assert a is not None
    now, onset = clock.now(), out.event.onset_step
    evidence = _outcome_evidence(out, n)
    blocked = _not_allowed(run)
    if blocked is None:
        policy = run.spec.spikes
        history = [r.past() for r in rollback_history(store, run.name)]
        rules = RollbackPolicy(
            max_rollbacks=policy.max_rollbacks, window_s=policy.window_h * 3600, lr_scale_repeat=policy.lr_scale_repeat
        )
        action = decide_rollback(out, verified_steps(store, run.name), history, now, spike_settings(policy), rules)
        if action.plan is not None:
            plan = action.plan
            record = RollbackRecord(
                run=run.name, attempt=a.seq, onset_step=onset, status=RollbackStatus.PLANNED, at=now,
                reason=action.reason, checkpoint_step=plan.checkpoint_step, skip=plan.skip,
                lr_scale=action.lr_scale, escalation=action.escalation,
            )  # fmt: skip
            evidence.update(
                checkpoint_step=plan.checkpoint_step, skip_first=plan.skip.first, skip_last=plan.skip.last,
                lr_scale=action.lr_scale, escalation=action.escalation,
            )  # fmt: skip
            message = (
                f"rollback: {_what(out)} at step {onset} {out.status.value}, rule {out.rule}, decided "
                f"{out.steps_after_onset} steps after onset ({out.reason}); {action.reason}"
            )
            log.warning("rollback_decided", run=run.name, onset=onset, checkpoint=plan.checkpoint_step)
            key = f"{run.name}:{a.seq}:rollback:{onset}"
            return [record, Event(run.name, EventKind.ROLLBACK, message, key, now, a.seq, a.job_id, evidence=evidence)]
        blocked = action.reason
    record = RollbackRecord(run.name, a.seq, onset, RollbackStatus.BLOCKED, now, blocked)
    message = (
        f"{_what(out)} at step {onset} {out.status.value}, rule {out.rule} ({out.reason}); not rolled back: {blocked}"
    )
    key = f"{run.name}:{a.seq}:rollback-blocked:{onset}"
    page = {**evidence, "page": True}
    return [record, Event(run.name, EventKind.ROLLBACK_BLOCKED, message, key, now, a.seq, a.job_id, evidence=page)]


def _what(out: SpikeOutcome) -> str:
    return "loss trend" if out.event.kind is SpikeKind.TREND else "spike"


def _not_allowed(run: RunRecord) -> str | None:
    if not run.spec.spikes.rollback:
        return "automatic rollback is off for this run ([spikes] rollback = false): a human decides"
    if run.spec.checkpoints is None:
        return "the run has no [checkpoints] section: no verified checkpoint to roll back to; a human decides"
    return None


def verified_steps(store: CheckpointLedger, run: str) -> list[int]:
    steps = []
    for ref, meta, full, demoted in store.checkpoints(run):
        eff = effective_result(meta, full)
        if eff is not None and eff.outcome is Outcome.VERIFIED and not demoted and ref.step is not None:
            steps.append(ref.step)
    return steps
