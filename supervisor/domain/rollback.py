"""Where a run rolls back to after a spike that did not heal: the newest verified checkpoint far
enough before the onset, and the data to skip after it (PaLM's recipe: restart some steps before
the spike and skip a few hundred batches). Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.domain.spikes import Decision, SpikeOutcome, SpikeSettings


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
