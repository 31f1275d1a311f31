"""Where a run rolls back to after a spike that did not heal: the newest verified checkpoint far
enough before the onset, and the data to skip after it (PaLM's recipe: restart some steps before
the spike and skip a few hundred batches). Pure: no I/O."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from supervisor.domain.spikes.events import Decision, SpikeOutcome, SpikeSettings


@dataclass(frozen=True)
class SkipRange:
    """Iterations to skip after a restart, inclusive (Megatron ``--skip-train-iteration-range
    first-last``)."""

    first: int
    last: int

    @property
    def batches(self) -> int:
        return self.last - self.first + 1

    def as_megatron(self) -> str:
        return f"{self.first}-{self.last}"


@dataclass(frozen=True)
class RollbackPlan:
    checkpoint_step: int
    skip: SkipRange
    reason: str


def choose_rollback(
    onset_step: int, verified_checkpoint_steps: list[int] | tuple[int, ...], min_steps_before: int
) -> int | None:
    """The newest verified checkpoint at least ``min_steps_before`` steps before the onset, or
    ``None`` when there is none."""
    limit = onset_step - min_steps_before
    eligible = [s for s in verified_checkpoint_steps if s <= limit]
    return max(eligible) if eligible else None


def suggest_skip(restart_step: int, onset_step: int, settings: SpikeSettings) -> SkipRange:
    """PaLM-style data skip after restarting from ``restart_step``: the iterations from the one
    after the restart step up to ``skip_batches`` past it, extended if needed to reach
    ``skip_past_onset`` steps beyond the onset, so the batches seen around the spike are skipped."""
    first = restart_step + 1
    last = max(restart_step + settings.skip_batches, onset_step + settings.skip_past_onset)
    return SkipRange(first, max(first, last))


def plan_rollback(
    outcome: SpikeOutcome, verified_checkpoint_steps: list[int] | tuple[int, ...], settings: SpikeSettings
) -> RollbackPlan | None:
    """Checkpoint and skip range for an outcome that asks for a rollback (``None`` if it does not
    or no checkpoint is old enough)."""
    if outcome.decision is not Decision.ROLLBACK:
        return None
    onset = outcome.event.onset_step
    ckpt = choose_rollback(onset, verified_checkpoint_steps, settings.min_steps_before)
    if ckpt is None:
        return None
    skip = suggest_skip(ckpt, onset, settings)
    reason = (
        f"restart from verified checkpoint {ckpt} (newest at least {settings.min_steps_before} steps "
        f"before onset {onset}); skip iterations {skip.as_megatron()} ({skip.batches} batches)"
    )
    return RollbackPlan(ckpt, skip, reason)


# --------------------------------------------------------------------------- automatic rollbacks, bounded


@dataclass(frozen=True)
class RollbackPolicy:
    """How far the supervisor rolls back by itself before a human must decide."""

    max_rollbacks: int = 3  # automatic rollbacks per window; then page a human
    window_s: float = 86400.0
    near_steps: int = 2000  # a spike this close to an earlier rollback's onset escalates
    skip_growth: float = 2.0  # each escalation multiplies the data skipped
    lr_scale_first: float = 1.0  # LR scale handed with a first rollback (OPT lowered it on repeats)
    lr_scale_repeat: float = 0.5  # multiplied in at each escalation


@dataclass(frozen=True)
class PastRollback:
    onset_step: int
    at: float
    lr_scale: float = 1.0


@dataclass(frozen=True)
class RollbackAction:
    """What to do about a spike that did not heal: roll back (``plan``) or page a human."""

    plan: RollbackPlan | None
    lr_scale: float
    escalation: int  # 0: first rollback near this onset; n: the n-th repeat
    reason: str

    @property
    def page(self) -> bool:
        return self.plan is None


def decide_rollback(
    outcome: SpikeOutcome,
    verified_checkpoint_steps: list[int] | tuple[int, ...],
    history: list[PastRollback],
    now: float,
    settings: SpikeSettings,
    policy: RollbackPolicy = RollbackPolicy(),
) -> RollbackAction:
    onset = outcome.event.onset_step
    recent = [r for r in history if now - r.at <= policy.window_s]
    if len(recent) >= policy.max_rollbacks:
        return RollbackAction(
            None,
            1.0,
            len(recent),
            f"{len(recent)} automatic rollbacks in the last {policy.window_s / 3600:g} h "
            f"(limit {policy.max_rollbacks}); not rolling back again by itself: a human decides",
        )
    near = [r for r in recent if abs(r.onset_step - onset) <= policy.near_steps]
    escalation = len(near)
    lr = policy.lr_scale_first * (policy.lr_scale_repeat**escalation)
    wider = SpikeSettings(
        **{**settings.__dict__, "skip_batches": int(settings.skip_batches * policy.skip_growth**escalation)}
    )
    plan = plan_rollback(outcome, verified_checkpoint_steps, wider)
    if plan is None:
        return RollbackAction(
            None,
            lr,
            escalation,
            f"no verified checkpoint at least {settings.min_steps_before} steps before the onset at "
            f"step {onset}; a human decides",
        )
    again = (
        f"; repeat {escalation} near step {onset}: skip ×{policy.skip_growth**escalation:g}, LR ×{lr:g}"
        if escalation
        else ""
    )
    lr_text = f"; LR ×{lr:g}" if lr != 1.0 and not escalation else ""
    return RollbackAction(plan, lr, escalation, plan.reason + again + lr_text)


# --------------------------------------------------------------------------- the record the engine reads back


class RollbackStatus(StrEnum):
    PLANNED = "planned"  # decided: the current attempt is stopped, the next one resumes as planned
    DONE = "done"  # the attempt that carries it out was submitted
    BLOCKED = "blocked"  # not rolled back (not allowed, no checkpoint, too many): a human decides


@dataclass(frozen=True)
class RollbackRecord:
    """One decision about a spike that did not heal, as the store keeps it: what later decisions
    read back (the pending rollback, the history that escalates and the skip ranges handed on)."""

    run: str
    attempt: int  # the attempt the spike happened in
    onset_step: int
    status: RollbackStatus
    at: float
    reason: str
    checkpoint_step: int | None = None
    skip: SkipRange | None = None
    lr_scale: float = 1.0
    escalation: int = 0

    @property
    def counts(self) -> bool:
        """A rollback that was (or is being) carried out: it escalates later ones."""
        return self.status is not RollbackStatus.BLOCKED

    def past(self) -> PastRollback:
        return PastRollback(self.onset_step, self.at, self.lr_scale)

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "attempt": self.attempt,
            "onset_step": self.onset_step,
            "status": self.status.value,
            "at": self.at,
            "reason": self.reason,
            "checkpoint_step": self.checkpoint_step,
            "skip": None if self.skip is None else [self.skip.first, self.skip.last],
            "lr_scale": self.lr_scale,
            "escalation": self.escalation,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RollbackRecord:
        skip = d.get("skip")
        return cls(
            run=str(d["run"]),
            attempt=int(d["attempt"]),
            onset_step=int(d["onset_step"]),
            status=RollbackStatus(d["status"]),
            at=float(d["at"]),
            reason=str(d.get("reason") or ""),
            checkpoint_step=None if d.get("checkpoint_step") is None else int(d["checkpoint_step"]),
            skip=None if not skip else SkipRange(int(skip[0]), int(skip[1])),
            lr_scale=float(d.get("lr_scale", 1.0)),
            escalation=int(d.get("escalation") or 0),
        )


def pending_rollback(history: Iterable[RollbackRecord], attempt: int | None) -> RollbackRecord | None:
    """The rollback decided in the current attempt and not carried out yet, if any."""
    planned = [r for r in history if r.status is RollbackStatus.PLANNED and r.attempt == attempt]
    return planned[-1] if planned else None


def skip_ranges(history: Iterable[RollbackRecord]) -> str:
    """Every carried-out rollback's skip range, Megatron style: "first-last,first-last" (a later
    restart may resume before one, so all stay in force)."""
    return ",".join(r.skip.as_megatron() for r in history if r.counts and r.skip is not None)
