"""Synthetic loss / grad-norm traces for the spike detector, one generator per pattern seen in real
runs, with every shape parameter drawn at random from a seed.

The real excerpts (tests/data/spike_cases) are few and short; these cover the patterns around them:

=====================  ========  ===================================================================
pattern                expected  modelled on
=====================  ========  ===================================================================
healthy                leave     a slowly falling loss, Gaussian or heavy-tailed noise
fast_heal              leave     BLOOM-176B 31216: x1.3-2.5, back in 10-60 steps, grad norm x10-1000
slow_heal              leave     BLOOM-13B 29050: x1.6-3.2, back in 250-700 steps, grad norm elevated
divergence             rollback  a steady climb to x1.4-2.2 over 100-300 steps, grad norm x5-20
plateau_aftershocks    rollback  a spike settling +10-15 % above, grad norm x1.5-8, 0-3 aftershocks
grad_norm_only         leave     grad-norm spikes x10-1000 with the loss unmoved (BLOOM-176B notes)
resume_spike_heals     leave     tr8b-104B 17062: a spike right after a resume, flat, then healed
=====================  ========  ===================================================================

Every trace is made per step, then logged every ``interval`` steps (1, 2, 5 or 10, drawn) as
Megatron does: the loss averaged over the interval, the grad norm of its last step, noise added per
record. ``onset_step`` is where the trouble truly begins (None for healthy traces), so decision
latency can be measured against the truth rather than against the detector's own estimate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from supervisor.domain.progress.record import ProgressRecord
from supervisor.domain.spikes.events import Decision

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True)
class SyntheticCase:
    name: str  # "pattern#seed"
    pattern: str
    expected: Decision
    onset_step: int | None
    records: tuple[ProgressRecord, ...]
    params: Mapping[str, float]


@dataclass(frozen=True)
class Shape:
    """A pattern's per-step multipliers: loss = base x (1 + excess), grad = base x grad_mult."""

    excess: Floats
    grad_mult: Floats
    onset: int | None  # index into the steps
    params: dict[str, float]


def _decay(n: int, start: int, height: float, steps_to_small: float, small: float) -> Floats:
    """``height`` from index ``start`` on, decaying exponentially to ``small`` after ``steps_to_small``."""
    t = np.arange(n, dtype=np.float64) - start
    tau = steps_to_small / np.log(max(height / small, 1.0001))
    return np.where(t >= 0, height * np.exp(-np.clip(t, 0, None) / tau), 0.0)


def _healthy(rng: np.random.Generator, interval: int) -> Shape:
    n = int(rng.integers(600, 3000))
    return Shape(np.zeros(n), np.ones(n), None, {"steps": n})


def _fast_heal(rng: np.random.Generator, interval: int) -> Shape:
    pre, heal, height = int(rng.integers(150, 600)), float(rng.uniform(10, 60)), float(rng.uniform(0.3, 1.5))
    n = pre + int(heal) + int(rng.integers(100, 300))
    excess = _decay(n, pre, height, heal, 0.015)
    gpeak = 10 ** rng.uniform(1, 3)
    grad = 1 + _decay(n, pre, gpeak - 1, heal / 2, 0.2)
    return Shape(excess, grad, pre, {"height": height, "heal_steps": heal, "grad_peak": gpeak})


def _slow_heal(rng: np.random.Generator, interval: int) -> Shape:
    pre, heal, height = int(rng.integers(150, 600)), float(rng.uniform(250, 700)), float(rng.uniform(0.6, 2.2))
    n = pre + int(heal) + int(rng.integers(100, 200))
    excess = _decay(n, pre, height, heal, 0.015)
    gpeak = 10 ** rng.uniform(0.7, 2)
    grad = 1 + _decay(n, pre, gpeak - 1, heal * float(rng.uniform(0.3, 0.8)), 0.2)
    return Shape(excess, grad, pre, {"height": height, "heal_steps": heal, "grad_peak": gpeak})


def _divergence(rng: np.random.Generator, interval: int) -> Shape:
    pre, span, rise = int(rng.integers(200, 600)), int(rng.integers(100, 300)), float(rng.uniform(0.4, 1.2))
    power, gpow = float(rng.uniform(1.0, 1.5)), float(rng.uniform(0.7, 1.3))
    n = pre + span
    x = np.clip((np.arange(n) - pre) / span, 0, None)
    return Shape(rise * x**power, 10 ** (gpow * x), pre, {"rise": rise, "span": span, "power": power})


def _plateau_aftershocks(rng: np.random.Generator, interval: int) -> Shape:
    pre, fall, height = int(rng.integers(200, 600)), int(rng.integers(5, 25)), float(rng.uniform(0.4, 2.0))
    level, shocks = float(rng.uniform(0.10, 0.15)), int(rng.integers(0, 4))
    gmult = float(rng.uniform(3, 8) if shocks == 0 else rng.uniform(1.5, 8))
    n = pre + fall + int(rng.integers(150, 300))
    t = np.arange(n) - pre
    excess = np.where(t >= 0, level + (height - level) * np.clip(1 - t / fall, 0, 1), 0.0)
    grad = np.where(t >= 0, gmult + (30 - gmult) * np.clip(1 - t / fall, 0, 1), 1.0)
    for at in rng.integers(pre + fall + 10, n - 5, size=shocks):
        width = int(rng.integers(1, 4)) * interval  # visible in the log: the loss is averaged per record
        excess[at : at + width] += rng.uniform(0.15, 0.6)
        grad[at : at + width] *= 10 ** rng.uniform(0.5, 1.5)
    return Shape(excess, grad, pre, {"height": height, "plateau": level, "grad_mult": gmult, "aftershocks": shocks})


def _grad_norm_only(rng: np.random.Generator, interval: int) -> Shape:
    n = int(rng.integers(600, 2000))
    grad = np.ones(n)
    excess = np.zeros(n)
    for at in rng.integers(100, n - 10, size=int(rng.integers(1, 5))):
        width = int(rng.integers(1, 6))
        grad[at : at + width] = 10 ** rng.uniform(1, 3)
        excess[at : at + width] = rng.uniform(0, 0.03)
    return Shape(excess, grad, None, {"steps": n})


def _resume_spike_heals(rng: np.random.Generator, interval: int) -> Shape:
    before, flat, heal = int(rng.integers(1, 6)), int(rng.integers(2, 11)), float(rng.uniform(20, 150))
    height = float(rng.uniform(0.3, 0.8))
    n = before + flat + int(heal) + int(rng.integers(100, 200))
    excess = _decay(n, before + flat, height, heal, 0.015)
    excess[before : before + flat] = height
    grad = 1 + _decay(n, before, float(rng.uniform(0, 2)), flat + heal / 2, 0.1)
    return Shape(excess, grad, before, {"height": height, "flat_steps": flat, "heal_steps": heal})


PATTERNS: dict[str, tuple[Decision, Callable[[np.random.Generator, int], Shape]]] = {
    "healthy": (Decision.LEAVE, _healthy),
    "fast_heal": (Decision.LEAVE, _fast_heal),
    "slow_heal": (Decision.LEAVE, _slow_heal),
    "divergence": (Decision.ROLLBACK, _divergence),
    "plateau_aftershocks": (Decision.ROLLBACK, _plateau_aftershocks),
    "grad_norm_only": (Decision.LEAVE, _grad_norm_only),
    "resume_spike_heals": (Decision.LEAVE, _resume_spike_heals),
}


def generate(pattern: str, seed: int) -> SyntheticCase:
    """One seeded trace of ``pattern`` (a key of :data:`PATTERNS`)."""
    expected, make = PATTERNS[pattern]
    rng = np.random.default_rng([seed, sorted(PATTERNS).index(pattern)])
    interval = int(rng.choice([1, 1, 2, 5, 10]))
    shape = make(rng, interval)
    level, noise = float(rng.uniform(1.6, 3.2)), float(rng.uniform(0.004, 0.015))
    start = int(rng.integers(5, 80)) * 1000 + 1
    n = len(shape.excess)
    drift = 1 - float(rng.uniform(0, 0.03)) * np.arange(n) / n  # the loss still falls, slowly
    loss = level * drift * (1 + shape.excess)
    grad = float(rng.uniform(0.15, 1.5)) * shape.grad_mult
    records = _log(rng, loss, grad, start, interval, noise)
    onset = None if shape.onset is None else start + shape.onset
    params = {**shape.params, "interval": interval, "level": level, "noise": noise}
    return SyntheticCase(f"{pattern}#{seed}", pattern, expected, onset, tuple(records), params)


def _log(
    rng: np.random.Generator, loss: Floats, grad: Floats, start: int, interval: int, noise: float
) -> list[ProgressRecord]:
    """Megatron-style records every ``interval`` steps: the mean loss of the interval, the last grad
    norm, with Gaussian or (half the time) heavy-tailed Student-t noise per record."""
    blocks = len(loss) // interval
    mean_loss = loss[: blocks * interval].reshape(blocks, interval).mean(axis=1)
    last_grad = grad[interval - 1 : blocks * interval : interval]
    heavy = rng.random() < 0.5
    shocks = rng.standard_t(4, blocks) / np.sqrt(2) if heavy else rng.standard_normal(blocks)
    mean_loss = mean_loss * (1 + noise * shocks)
    last_grad = last_grad * 10 ** (rng.uniform(0.03, 0.1) * rng.standard_normal(blocks))
    steps = start - 1 + interval * np.arange(1, blocks + 1)
    return [
        ProgressRecord(step=int(s), source_format="synthetic", loss=float(v), grad_norm=float(g))
        for s, v, g in zip(steps, mean_loss, last_grad, strict=True)
    ]


def case_set(seeds: int = 8, first_seed: int = 0) -> list[SyntheticCase]:
    """``seeds`` traces of every pattern, seeds ``first_seed`` .. ``first_seed + seeds - 1``."""
    return [generate(p, s) for p in PATTERNS for s in range(first_seed, first_seed + seeds)]
