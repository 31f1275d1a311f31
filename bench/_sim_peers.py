"""``bench/simulate.py --peer-copies K``: a sharded state (FSDP/ZeRO-3 with tensor and pipeline
shards, as Llama 3 405B's 4D parallelism: no survivor holds a dead node's shards, so nothing saves
on failure), recovered in the allocation with and without in-memory peer copies every K steps
(supervisor/sim/training/peer_copies.py), beside the fair baseline (Slurm alone, as many idle nodes), on the
same failure draw per seed. The run without copies keeps today's checkpoint interval (Young/Daly on
every failure); the run with copies trades its storage saves against the resubmissions only.

Last line, one JSON object: ``ettr_in_allocation`` (with the copies), ``ettr_in_allocation_without_copies``,
``ettr_baseline_same_spares``, their minima, ``memory_restores_mean``, ``copy_cost_share`` (the
snapshots' stall over the training time), ``checkpoint_interval_s`` of each, the loss breakdown,
``goal_ettr_in_allocation_met`` (>= 0.98). ``--copies-only``: the run without copies is left out
(its figures null; without save on failure it is the plain ``bench/simulate.py`` in-allocation run).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from _common import table

from supervisor.sim.plan import Plan, assumptions, make_plan
from supervisor.sim.runner import Simulation
from supervisor.sim.training.results import SimResult
from supervisor.sim.training.settings import Mode, SimSettings

COLUMNS = ("seed", "failures", "interrupts", "ettr_copies", "ettr_no_copies", "ettr_base_spares",
           "memory_restores", "wall_copies_s", "wall_no_copies_s")  # fmt: skip


def run(args: Any, settings: SimSettings) -> dict[str, Any]:
    """Every seed in the three runs; prints the table and the assumptions; the figures."""
    plain = make_plan(settings, args.checkpoint_interval)
    copies = make_plan(replace(settings, trainer=replace(settings.trainer, peer_copies_steps=args.peer_copies)),
                       args.checkpoint_interval)  # fmt: skip
    rows, with_, without, fair, walls = [], [], [], [], []
    with tempfile.TemporaryDirectory(prefix="ssv-bench-peers-") as tmp:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            draw = settings.failures.draw(seed, settings.gpus, settings.seconds)
            c, wall_c = _timed(_sim(copies, seed, Mode.IN_ALLOCATION, Path(tmp) / f"c{seed}"), draw)
            p, wall_p = (
                (None, 0.0)
                if args.copies_only
                else _timed(_sim(plain, seed, Mode.IN_ALLOCATION, Path(tmp) / f"p{seed}"), draw)
            )
            f, _ = _timed(
                Simulation(replace(plain.settings, seed=seed, baseline_spares=settings.spares), Mode.BASELINE), draw
            )
            with_.append(c), fair.append(f), walls.append((wall_c, wall_p))
            without += [p] if p is not None else []
            restores, plain_ettr = c.extra["memory_restores"], f"{p.ettr:.2%}" if p is not None else "-"
            rows.append((seed, len(draw), c.interruptions, f"{c.ettr:.2%}", plain_ettr, f"{f.ettr:.2%}",
                         restores, f"{wall_c:.1f}", f"{wall_p:.1f}"))  # fmt: skip
            print(f"seed {seed}: in-allocation with peer copies {c.ettr:.4%}, without {plain_ettr}, fair baseline "
                  f"{f.ettr:.4%}; {restores} restores from memory; lost s {_loss([c])} ({wall_c:.1f} s, {wall_p:.1f} s)",
                  file=sys.stderr, flush=True)  # fmt: skip
    print(table(rows, COLUMNS))
    print("assumed (with peer copies):")
    for key, value in assumptions(copies):
        print(f"  {key}: {value}")
    print(f"  without copies: checkpoint every {plain.checkpoint_interval_s:.0f} s (Young/Daly on every failure)")
    for name, results in [("with copies", with_)] + ([("without copies", without)] if without else []):
        print(f"  lost, {name} (h per run): " + ", ".join(f"{k} {v / 3600:.1f}" for k, v in _loss(results).items()))
    return _figures(args, copies, plain, with_, without, fair, walls)


def _sim(plan: Plan, seed: int, mode: Mode, state: Path) -> Simulation:
    return Simulation(replace(plan.settings, seed=seed), mode, state)


def _timed(sim: Simulation, draw: list[Any]) -> tuple[SimResult, float]:
    started = time.perf_counter()
    result = sim.run(draw)
    return result, time.perf_counter() - started


def _loss(results: list[SimResult]) -> dict[str, float]:
    keys = ("detect_s", "restart_s", "rework_s")
    out = {k: statistics.fmean(r.extra["loss_s"][k] for r in results) for k in keys}  # type: ignore[index]
    out["lost_s"] = statistics.fmean(r.wall_s - r.productive_s for r in results)
    return out


def _copy_cost_share(plan: Plan) -> float:
    """The snapshots' stall per step over the step time (the copies' cost per step)."""
    t = plan.settings.trainer
    assert t.peer_copies_steps
    return t.peer_copy_s / (t.peer_copies_steps * t.step_s)


def _figures(args: Any, copies: Plan, plain: Plan, with_: list[SimResult], without: list[SimResult],
             fair: list[SimResult], walls: list[tuple[float, float]]) -> dict[str, Any]:  # fmt: skip
    ettr = statistics.fmean(r.ettr for r in with_)
    return {
        "layout": "sharded",
        "peer_copies_steps": args.peer_copies,
        "ettr_in_allocation": round(ettr, 4),
        "ettr_in_allocation_min": round(min(r.ettr for r in with_), 4),
        "ettr_in_allocation_without_copies": round(statistics.fmean(r.ettr for r in without), 4) if without else None,
        "ettr_in_allocation_without_copies_min": round(min(r.ettr for r in without), 4) if without else None,
        "ettr_baseline_same_spares": round(statistics.fmean(r.ettr for r in fair), 4),
        "interruptions_mean": round(statistics.fmean(r.interruptions for r in with_), 1),
        "memory_restores_mean": round(statistics.fmean(r.extra["memory_restores"] for r in with_), 1),  # type: ignore[misc]
        "copy_cost_share": round(_copy_cost_share(copies), 5),
        "checkpoint_interval_s": round(copies.checkpoint_interval_s),
        "checkpoint_interval_without_copies_s": round(plain.checkpoint_interval_s),
        "loss_h_with_copies": {k: round(v / 3600, 2) for k, v in _loss(with_).items()},
        "loss_h_without_copies": {k: round(v / 3600, 2) for k, v in _loss(without).items()} if without else None,
        "wall_s_per_run": round(statistics.fmean(w for pair in walls for w in pair if w), 1),
        "seeds": args.seeds,
        "first_seed": args.first_seed,
        "days": args.days,
        "goal_ettr_in_allocation_met": ettr >= 0.98,
    }
