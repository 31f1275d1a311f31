"""From what a planner asks ("16K GPUs, a checkpoint every 15 min or Young/Daly, 10 s saves") to
``SimSettings``; several seeds in both modes; the figures averaged over seeds; the demo scenario."""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from supervisor.sim.failures import TABLE5, Failure, FailureModel, young_daly_interval
from supervisor.sim.results import SimResult, quantile
from supervisor.sim.runner import Simulation
from supervisor.sim.settings import Mode, SimSettings
from supervisor.sim.trainer import TrainerSettings


def checkpoint_steps(
    interval: str | float, trainer: TrainerSettings, model: FailureModel, gpus: int
) -> tuple[int, float]:
    """Steps between saves for ``interval`` (seconds, or "auto" = Young/Daly from the failure rate
    and the save cost); returns (steps, the interval in seconds it stands for)."""
    if isinstance(interval, str) and interval.strip().lower() == "auto":
        seconds = young_daly_interval(trainer.save_s, model.mtbf_s(gpus))
    else:
        try:
            seconds = float(interval)
        except ValueError:
            raise ValueError(f"checkpoint interval {interval!r} is neither seconds nor 'auto'") from None
        if seconds <= 0:
            raise ValueError(f"checkpoint interval must be positive seconds or 'auto' (got {interval!r})")
    lines = max(1, round(seconds / trainer.line_s))
    return lines * trainer.log_every, lines * trainer.line_s


@dataclass(frozen=True)
class Plan:
    settings: SimSettings
    checkpoint_interval_s: float
    checkpoint_source: str  # "auto (Young/Daly)" or "given"


def make_plan(settings: SimSettings, interval: str | float) -> Plan:
    steps, seconds = checkpoint_steps(interval, settings.trainer, settings.failures, settings.gpus)
    trainer = replace(settings.trainer, checkpoint_steps=steps)
    source = "auto (Young/Daly)" if isinstance(interval, str) and interval.strip().lower() == "auto" else "given"
    return Plan(replace(settings, trainer=trainer), seconds, source)


def run_seeds(
    plan: Plan,
    modes: Sequence[Mode],
    seeds: Sequence[int],
    state_root: Path | None,
    progress: Callable[[str, float], None] | None = None,
) -> dict[Mode, list[SimResult]]:
    """Every seed in every mode, on the same failure draw per seed (a paired comparison)."""
    out: dict[Mode, list[SimResult]] = {m: [] for m in modes}
    root = state_root or Path(tempfile.mkdtemp(prefix="ssv-sim-"))
    for seed in seeds:
        settings = replace(plan.settings, seed=seed)
        draw = settings.failures.draw(seed, settings.gpus, settings.seconds)
        for mode in modes:
            state = root if len(seeds) == 1 else root / f"seed-{seed}"
            label = f"{mode.value} seed {seed}"
            tick = (lambda f, label=label: progress(label, f)) if progress else None
            sim = Simulation(settings, mode, state_dir=state if mode is Mode.SUPERVISOR else None, on_progress=tick)
            out[mode].append(sim.run(draw))
    return out


def summary(results: Sequence[SimResult]) -> dict[str, object]:
    """Figures over seeds: means, and the recovery quantiles over every interruption of every seed."""
    recover = sorted(t for r in results for t in r.recover_times())
    causes: dict[str, float] = {}
    for r in results:
        for cause, n in r.by_cause().items():
            causes[cause] = causes.get(cause, 0.0) + n / len(results)
    return {
        "runs": len(results),
        "ettr": statistics.fmean(r.ettr for r in results),
        "ettr_min": min(r.ettr for r in results),
        "interruptions": statistics.fmean(r.interruptions for r in results),
        "failures_drawn": statistics.fmean(len(r.strikes) for r in results),
        "lost_gpu_hours": statistics.fmean(r.lost_gpu_hours for r in results),
        "recover_p50_s": quantile(recover, 0.5),
        "recover_p90_s": quantile(recover, 0.9),
        "attempts": statistics.fmean(r.attempts for r in results),
        "crash_restarts": statistics.fmean(r.crash_restarts for r in results),
        "torn_restarts": statistics.fmean(r.torn_restarts for r in results),
        "by_cause": dict(sorted(causes.items(), key=lambda kv: -kv[1])),
        "cpu_s": statistics.fmean(r.cpu_s for r in results),
        "ticks": statistics.fmean(r.ticks for r in results),
    }


def assumptions(plan: Plan) -> list[tuple[str, str]]:
    s, t = plan.settings, plan.settings.trainer
    return [
        ("failure model", s.failures.source),
        ("MTBF of the job", f"{s.failures.mtbf_s(s.gpus) / 3600:.2f} h ({s.gpus} GPUs)"),
        ("step time", f"{t.step_s:g} s (noise {t.step_noise:.0%}), a log line every {t.log_every} steps"),
        (
            "checkpoint",
            f"every {t.checkpoint_steps} steps = {plan.checkpoint_interval_s:.0f} s of training "
            f"[{plan.checkpoint_source}], save {t.save_s:g} s (blocking)",
        ),
        (
            "restart costs",
            f"startup {t.startup_s:g} s + restore {t.restore_s:g} s; a job on a broken GPU dies "
            f"after {t.crash_at_start_s:g} s",
        ),
        (
            "repairs",
            f"reboot {s.repair.reboot_s / 60:g} min, replacement {s.repair.replace_s / 3600:g} h (medians, "
            f"log-normal sigma {s.repair.sigma:g})",
        ),
        (
            "detection",
            f"daemon poll {s.poll_interval_s:g} s, probe confirm {s.probe_confirm_s:g} s, hang multiple "
            f"{s.hang_multiple:g}; Slurm SlurmdTimeout {s.slurmd_timeout_s:g} s, NHC every "
            f"{s.health_check_s:g} s; NCCL watchdog {s.nccl_timeout_s:g} s",
        ),
        (
            "nodes",
            f"{s.nodes_per_job} x {s.gpus_per_node} GPUs for the job; supervisor: {s.spares} named spares; "
            f"baseline: {s.baseline_spares} idle nodes (Slurm alone, requeue from the job's trap)",
        ),
    ]


# -- the demo: a small cluster, a day, a few faults of different causes --------------------------

DEMO_FAULTS: tuple[tuple[float, str], ...] = (
    (3.0, "Faulty GPU"),  # hours after the start, Table 5 component
    (8.0, "Host Maintenance"),
    (13.0, "NCCL Watchdog Timeouts"),
    (18.0, "Software Bug"),
)


def demo_settings(seed: int = 7) -> SimSettings:
    return SimSettings(gpus=128, gpus_per_node=8, spares=2, days=1.0, seed=seed)


def demo_failures(seed: int = 7, faults: Sequence[tuple[float, str]] = DEMO_FAULTS) -> list[Failure]:
    import random

    rng = random.Random(f"demo:{seed}")
    cats = {c.component: c for c in TABLE5}
    return [Failure(hours * 3600.0, cats[name], rng.random(), rng.random(), rng.random()) for hours, name in faults]
