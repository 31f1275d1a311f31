"""In-allocation recovery's two halves of one job step: what the daemon wants the step to be
(``StepGoal``, written only by a journaled ``swap_step``) and what the launcher in the job last
said it is (``LauncherReport``). Pure values (docs/in-allocation.md)."""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.domain.checkpoints.resume import ResumePlan


@dataclass(frozen=True)
class StepGoal:
    """The step the job should run: generation ``generation`` on ``nodes``, resumed from ``resume``.
    The generation is the idempotency key: the launcher relaunches once per generation."""

    job_id: int
    generation: int
    nodes: tuple[str, ...]
    reason: str
    decided_at: float
    resume: ResumePlan | None = None


@dataclass(frozen=True)
class LauncherReport:
    """What the launcher said last (``at``: when the daemon heard it, on the daemon's clock)."""

    job_id: int
    generation: int
    alive: bool
    nodes: tuple[str, ...]
    host: str
    at: float
    exit_code: int | None = None
    # When the daemon first heard this generation's step ended (None: it runs). The launcher
    # repeats its report every poll, so ``at`` keeps moving; waits count from this.
    ended_at: float | None = None

    @property
    def ended(self) -> float:
        """When the step ended, as first heard (``at`` for a report not read from the store)."""
        return self.ended_at if self.ended_at is not None else self.at


@dataclass(frozen=True)
class AllocationStep:
    """The current job's newest goal (None: generation 0, the launcher's own start) and report."""

    goal: StepGoal | None = None
    report: LauncherReport | None = None
    # Since when the daemon's launcher channel listens: silence is judged from then at the
    # earliest (a daemon that was stopped heard nothing, and the launcher was not silent for it).
    listening_since: float = 0.0


def initial_nodes(allocation: tuple[str, ...], nodes: int) -> tuple[str, ...]:
    """Generation 0's nodes: the first ``nodes`` of the allocation in Slurm's hostlist order — what
    the launcher starts on by itself, without asking the daemon."""
    return tuple(allocation[:nodes])
