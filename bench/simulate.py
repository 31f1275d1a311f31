"""Llama 3 405B at scale in the simulator: 16,384 GPUs (2,048 nodes), 54 days, Table 5's failure mix.

For each seed the same failure draw runs three times: with the supervisor (the real engine, store
and logbook on the simulated cluster, 64 named spares), with plain Slurm requeue and no idle node
(baseline: detection by NCCL's watchdog or SlurmdTimeout, restart from the newest checkpoint
whatever its state), and with plain Slurm requeue and as many idle nodes in the partition as the
supervisor has spares (the fair baseline: the same idle capacity). All three use the same
checkpoint interval (Young/Daly from the failure rate and save cost, or the one given). Prints a
table per seed, the assumed costs, and as its last line one JSON object: ``interruptions_mean``,
``ettr_supervisor``, ``ettr_baseline``, ``ettr_baseline_same_spares``, ``spare_node_hours``,
``wall_s_per_run``.

    python bench/simulate.py              # 10 seeds (the issue's figure), both modes
    python bench/simulate.py --seeds 2    # quicker
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import table  # noqa: E402

from supervisor.adapters.logging import configure_logging  # noqa: E402
from supervisor.sim.failures import TABLE5_DAYS, TABLE5_GPUS, TABLE5_TOTAL  # noqa: E402
from supervisor.sim.plan import assumptions, make_plan, spare_node_hours  # noqa: E402
from supervisor.sim.runner import Simulation  # noqa: E402
from supervisor.sim.settings import Mode, SimSettings  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 (default 10)")
    ap.add_argument("--days", type=float, default=TABLE5_DAYS)
    ap.add_argument("--gpus", type=int, default=TABLE5_GPUS)
    ap.add_argument("--spares", type=int, default=64)
    ap.add_argument("--checkpoint-interval", default="auto")
    ap.add_argument(
        "--no-node-agents",
        action="store_true",
        help="the engine reads no node-agent findings (GPU faults seen only when the job dies)",
    )
    args = ap.parse_args()
    configure_logging("warning", "json")
    plan = make_plan(
        SimSettings(gpus=args.gpus, days=args.days, spares=args.spares, node_agents=not args.no_node_agents),
        args.checkpoint_interval,
    )
    rows, sup, base, fair, walls = [], [], [], [], []
    with tempfile.TemporaryDirectory(prefix="ssv-bench-sim-") as tmp:
        for seed in range(args.seeds):
            settings = replace(plan.settings, seed=seed)
            draw = settings.failures.draw(seed, settings.gpus, settings.seconds)
            started = time.perf_counter()
            s = Simulation(settings, Mode.SUPERVISOR, Path(tmp) / f"seed-{seed}").run(draw)
            wall = time.perf_counter() - started
            started = time.perf_counter()
            b = Simulation(settings, Mode.BASELINE).run(draw)
            wall_b = time.perf_counter() - started
            f = Simulation(replace(settings, baseline_spares=settings.spares), Mode.BASELINE).run(draw)
            sup.append(s)
            base.append(b)
            fair.append(f)
            walls.append(wall)
            rows.append(
                (
                    seed,
                    len(draw),
                    s.interruptions,
                    f"{s.ettr:.2%}",
                    f"{b.ettr:.2%}",
                    f"{f.ettr:.2%}",
                    _q(s.recover_quantile(0.5)),
                    _q(b.recover_quantile(0.5)),
                    _q(f.recover_quantile(0.5)),
                    s.crash_restarts,
                    s.ticks,
                    f"{wall:.1f}",
                    f"{wall_b:.1f}",
                )
            )
            print(
                f"seed {seed}: supervisor ETTR {s.ettr:.2%}, baseline {b.ettr:.2%}, "
                f"baseline with {settings.spares} idle nodes {f.ettr:.2%} ({wall:.1f} s + {wall_b:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
    print(
        table(
            rows,
            (
                "seed",
                "failures",
                "interrupts",
                "ettr_sup",
                "ettr_base",
                "ettr_base_spares",
                "recover_p50_sup",
                "recover_p50_base",
                "recover_p50_base_spares",
                "crash_restarts",
                "ticks",
                "wall_sup_s",
                "wall_base_s",
            ),
        )
    )
    print(
        f"\nexpected failures per run: {TABLE5_TOTAL * args.gpus / TABLE5_GPUS * args.days / TABLE5_DAYS:.1f}"
        f" (Table 5: {TABLE5_TOTAL} in {TABLE5_DAYS:g} days on {TABLE5_GPUS} GPUs)"
    )
    print("assumed:")
    for key, value in assumptions(plan):
        print(f"  {key}: {value}")
    print(f"  fair baseline: {plan.settings.spares} idle nodes (as many as the supervisor's spares), same checkpoints")
    ettr_s = statistics.fmean(r.ettr for r in sup)
    figures = {
        "interruptions_mean": round(statistics.fmean(r.interruptions for r in sup), 1),
        "failures_drawn_mean": round(statistics.fmean(len(r.strikes) for r in sup), 1),
        "ettr_supervisor": round(ettr_s, 4),
        "ettr_baseline": round(statistics.fmean(r.ettr for r in base), 4),
        "ettr_baseline_same_spares": round(statistics.fmean(r.ettr for r in fair), 4),
        "spare_node_hours": round(statistics.fmean(spare_node_hours(r) for r in sup), 1),
        "spare_node_hours_baseline_same_spares": round(statistics.fmean(spare_node_hours(r) for r in fair), 1),
        "checkpoint_interval_s": round(plan.checkpoint_interval_s),
        "ettr_supervisor_min": round(min(r.ettr for r in sup), 4),
        "wall_s_per_run": round(statistics.fmean(walls), 1),
        "cpu_s_per_run": round(statistics.fmean(r.cpu_s for r in sup), 1),
        "seeds": args.seeds,
        "goal_ettr_met": ettr_s >= 0.95,
        "goal_wall_met": statistics.fmean(walls) < 60.0,
    }
    print(json.dumps(figures))
    return 0


def _q(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


if __name__ == "__main__":
    sys.exit(main())
