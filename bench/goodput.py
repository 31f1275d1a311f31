"""Goodput as the logbook reports it against what the simulator measured, on the same runs.

The simulator knows the truth of each run (the steps kept x the step time, over the wall time);
``logbook goodput`` knows only what the daemon read and recorded (attempts, the logbook, the
progress series). For each seed of a Llama-3-scale run (16,384 GPUs, 54 days, Table 5's failure
mix, the real engine supervising) this compares the two ETTRs, counts "upper bound" caveats, and
checks that the lost time by cause sums to the simulator's lost time. Last line, one JSON object:
``max_abs_diff_pp``, ``seeds``, ``upper_bound_count`` (and ``max_lost_diff_pp``: the largest gap
between the lost time by cause, summed, and the simulator's, as a share of the wall time).

    python bench/goodput.py              # 10 seeds, 54 days (the issue's check)
    python bench/goodput.py --seeds 2 --days 5
    python bench/goodput.py --jobs 10    # seeds in parallel (the store's fsyncs leave the CPU idle)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import table  # noqa: E402

from supervisor.adapters.logging import configure_logging  # noqa: E402
from supervisor.adapters.sqlite import SqliteStore  # noqa: E402
from supervisor.domain.goodput.account import Goodput, goodput  # noqa: E402
from supervisor.sim.faults.failures import TABLE5_DAYS, TABLE5_GPUS  # noqa: E402
from supervisor.sim.plan import make_plan  # noqa: E402
from supervisor.sim.runner import RUN, Simulation  # noqa: E402
from supervisor.sim.training.results import SimResult  # noqa: E402
from supervisor.sim.training.settings import Mode, SimSettings  # noqa: E402


def logbook_goodput(state: Path, result: SimResult) -> Goodput:
    """What `logbook goodput` computes on the state directory the simulation left."""
    store = SqliteStore(state)
    try:
        attempts, events, series = store.attempts(RUN), store.events(RUN), store.progress(RUN)
    finally:
        store.close()
    end = attempts[0].submitted_at + result.wall_s
    return goodput(RUN, attempts, events, now=end, series=series)


def one_seed(job: tuple[SimSettings, int]) -> tuple[int, SimResult, Goodput, float]:
    """Simulate one seed with the supervisor, then account for it from the state directory alone."""
    settings, seed = job
    with tempfile.TemporaryDirectory(prefix="ssv-bench-goodput-") as tmp:
        state = Path(tmp) / f"seed-{seed}"
        started = time.perf_counter()
        sim = Simulation(replace(settings, seed=seed), Mode.SUPERVISOR, state).run()
        g = logbook_goodput(state, sim)
        return seed, sim, g, time.perf_counter() - started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 (default 10)")
    ap.add_argument("--days", type=float, default=TABLE5_DAYS)
    ap.add_argument("--gpus", type=int, default=TABLE5_GPUS)
    ap.add_argument("--jobs", type=int, default=1, help="seeds simulated in parallel (default 1)")
    args = ap.parse_args()
    configure_logging("warning", "json")
    plan = make_plan(SimSettings(gpus=args.gpus, days=args.days, spares=64), "auto")
    rows, diffs, lost_diffs, upper = [], [], [], 0
    jobs = [(plan.settings, seed) for seed in range(args.seeds)]
    with multiprocessing.Pool(max(1, args.jobs), initializer=configure_logging, initargs=("warning", "json")) as pool:
        done = sorted(pool.imap_unordered(one_seed, jobs), key=lambda r: r[0])
    for seed, sim, g, wall in done:
        diff = 100 * ((g.ettr or 0.0) - sim.ettr)
        lost_diff = 100 * (g.lost.total_s + g.idle_s - (sim.wall_s - sim.productive_s)) / sim.wall_s
        diffs.append(abs(diff))
        lost_diffs.append(abs(lost_diff))
        upper += int(g.upper_bound)
        rows.append(
            (
                seed,
                sim.interruptions,
                len(g.interruptions),
                f"{sim.ettr:.2%}",
                f"{g.ettr or 0.0:.2%}",
                f"{diff:+.2f}",
                f"{lost_diff:+.2f}",
                "yes" if g.upper_bound else "no",
                f"{wall:.0f}",
            )
        )
    heads = ("seed", "interrupts_sim", "interrupts_logbook", "ettr_sim", "ettr_logbook", "diff_pp", "lost_diff_pp")
    print(table(rows, (*heads, "upper_bound", "wall_s")))
    figures = {
        "max_abs_diff_pp": round(max(diffs), 3),
        "seeds": args.seeds,
        "upper_bound_count": upper,
        "max_lost_diff_pp": round(max(lost_diffs), 3),
        "days": args.days,
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
