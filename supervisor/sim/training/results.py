"""What one simulation measured: ground truth from the trainer and the failure draw."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from supervisor.sim.training.settings import Mode, SimSettings
from supervisor.sim.training.trainer import Attempt


@dataclass
class Strike:
    """One drawn failure as it landed."""

    at: float  # virtual time
    cause: str
    shows: str
    node: str
    interrupted: bool  # it stopped an attempt that was running
    step: int | None = None  # the step the attempt had reached
    recovered_at: float | None = None  # the next attempt began computing


@dataclass
class SimResult:
    settings: SimSettings
    mode: Mode
    wall_s: float  # virtual seconds simulated
    kept_steps: int
    strikes: list[Strike]
    attempts: int
    torn_restarts: int  # baseline: restarts that found the newest checkpoint torn
    crash_restarts: int  # restarts that died at start on a node with a broken GPU
    ticks: int = 0
    cpu_s: float = 0.0  # real seconds the simulation took
    state_dir: str | None = None
    run: str = ""
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def productive_s(self) -> float:
        return self.kept_steps * self.settings.trainer.step_s

    @property
    def ettr(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def lost_gpu_hours(self) -> float:
        return self.settings.gpus * max(0.0, self.wall_s - self.productive_s) / 3600.0

    @property
    def interruptions(self) -> int:
        return sum(1 for s in self.strikes if s.interrupted)

    def by_cause(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.strikes:
            if s.interrupted:
                out[s.cause] = out.get(s.cause, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))

    def recover_times(self) -> list[float]:
        return sorted(s.recovered_at - s.at for s in self.strikes if s.interrupted and s.recovered_at is not None)

    def recover_quantile(self, q: float) -> float | None:
        return quantile(self.recover_times(), q)


def quantile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated quantile of sorted ``values`` (None when empty)."""
    if not values:
        return None
    pos = q * (len(values) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def mark_recoveries(strikes: list[Strike], attempts: Sequence[Attempt], end: float) -> None:
    """Each interruption recovers when a later attempt begins computing (and really computes)."""
    computing = sorted(
        a.computing_at
        for a in attempts
        if a.computing_at <= end and (a.stopped_at is None or a.computing_at < a.stopped_at) and not a.resume_torn
    )
    i = 0
    for strike in sorted((s for s in strikes if s.interrupted), key=lambda s: s.at):
        while i < len(computing) and computing[i] <= strike.at:
            i += 1
        if i < len(computing):
            strike.recovered_at = computing[i]


def loss_breakdown(strikes: Sequence[Strike], attempts: Sequence[Attempt], step_s: float) -> dict[str, float]:
    """Where the interruptions' time went, in seconds, from the ground truth: ``detect_s`` (the
    failure until the next attempt starts: detection, decision, queue, relaunch wait),
    ``restart_s`` (that attempt's start-up and restore) and ``rework_s`` (steps trained since the
    checkpoint it resumed from, trained again). Checkpoint saves and step noise are the rest."""
    by_computing = {a.computing_at: a for a in attempts}
    out = {"detect_s": 0.0, "restart_s": 0.0, "rework_s": 0.0}
    for s in strikes:
        a = by_computing.get(s.recovered_at) if s.interrupted and s.recovered_at is not None else None
        if a is None:
            continue
        out["detect_s"] += max(0.0, a.started_at - s.at)
        out["restart_s"] += a.computing_at - max(a.started_at, s.at)
        out["rework_s"] += max(0, (s.step or 0) - a.resume_step) * step_s
    return out
