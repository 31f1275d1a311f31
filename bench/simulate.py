"""Llama 3 405B at scale in the simulator: 16,384 GPUs (2,048 nodes), 54 days, Table 5's failure mix.

For each seed the same failure draw runs four times: with the supervisor resubmitting (the real
engine, store and logbook on the simulated cluster, 64 named spares), with the supervisor
recovering inside the allocation (``--no-kill``, 16 of the 64 spares held in the job as hot spares,
a swap relaunches the step in the same job; out of hot spares it resubmits), with plain Slurm requeue and no idle node
(baseline: detection by NCCL's watchdog or SlurmdTimeout, restart from the newest checkpoint
whatever its state), and with plain Slurm requeue and as many idle nodes in the partition as the
supervisor has spares (the fair baseline: the same idle capacity). All three use the same
checkpoint interval (Young/Daly from the failure rate and save cost, or the one given). Prints a
table per seed, the assumed costs, where the lost time went, and as its last line one JSON object:
``interruptions_mean``, ``ettr_supervisor``, ``ettr_in_allocation``, ``ettr_baseline``,
``ettr_baseline_same_spares``, ``spare_node_hours``, ``spare_node_hours_in_allocation``,
``wall_s_per_run`` (mean over the supervised runs of both modes), ``ettr_ceiling`` (what no
recovery can beat at these checkpoint costs: saves plus the work since the last save, detection,
start-up and restore free) and ``ettr_ceiling_with_restore``, among others.

``--save-on-failure SECONDS``: the trainer saves on failure in every mode (supervisor/sim/training/survivors.py:
when one node's ranks die, XID/ECC/NIC, the survivors save the step in progress and exit), the
supervised runs' spec gives them the daemon's grace, and the checkpoint interval and the ceilings
count only the failures that still lose the work since the last save; JSON ``save_on_failure_s``
(null when off), ``survivor_saves_mean`` and ``survivor_saves_torn_mean`` per mode.

    python bench/simulate.py                            # 10 seeds (the issue's figure), every mode
    python bench/simulate.py --seeds 2                  # quicker
    python bench/simulate.py --seeds 2 --save-on-failure 30
    python bench/simulate.py --peer-copies 10           # a sharded state: in-memory peer copies (bench/_sim_peers.py)
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

import _sim_peers  # noqa: E402
from _common import table  # noqa: E402

from supervisor.adapters.logging import configure_logging  # noqa: E402
from supervisor.sim.faults.failures import TABLE5_DAYS, TABLE5_GPUS, TABLE5_TOTAL, Failure, Manifestation  # noqa: E402
from supervisor.sim.plan import assumptions, make_plan, spare_node_hours  # noqa: E402
from supervisor.sim.runner import Simulation  # noqa: E402
from supervisor.sim.training.results import SimResult, quantile  # noqa: E402
from supervisor.sim.training.settings import Mode, SimSettings  # noqa: E402
from supervisor.sim.training.survivors import covers, daemon_grace_s  # noqa: E402
from supervisor.sim.training.trainer import TrainerSettings  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 (default 10)")
    ap.add_argument("--days", type=float, default=TABLE5_DAYS)
    ap.add_argument("--gpus", type=int, default=TABLE5_GPUS)
    ap.add_argument("--spares", type=int, default=64)
    ap.add_argument("--hot-spares", type=int, default=16, help="of the spares, held in the job (in-allocation)")
    ap.add_argument("--checkpoint-interval", default="auto")
    ap.add_argument(
        "--no-node-agents",
        action="store_true",
        help="the engine reads no node-agent findings (GPU faults seen only when the job dies)",
    )
    ap.add_argument(
        "--save-on-failure",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the trainer saves on failure, taking SECONDS (every mode); default off",
    )
    ap.add_argument(
        "--peer-copies",
        type=int,
        default=None,
        metavar="K",
        help="a sharded state: in-allocation with and without in-memory peer copies every K steps, "
        "beside the fair baseline (bench/_sim_peers.py); no save on failure",
    )
    ap.add_argument("--first-seed", type=int, default=0, help="with --peer-copies: seeds FIRST..FIRST+N-1")
    ap.add_argument("--copies-only", action="store_true", help="with --peer-copies: leave out the run without copies")
    args = ap.parse_args()
    configure_logging("warning", "json")
    if args.peer_copies is not None:
        if args.save_on_failure is not None:
            ap.error("--peer-copies is for a sharded state, whose survivors cannot save on failure")
        base = SimSettings(gpus=args.gpus, days=args.days, spares=args.spares, hot_spares=args.hot_spares,
                           node_agents=not args.no_node_agents)  # fmt: skip
        print(json.dumps(_sim_peers.run(args, base)))
        return 0
    plan = make_plan(
        SimSettings(
            gpus=args.gpus,
            days=args.days,
            spares=args.spares,
            hot_spares=args.hot_spares,
            node_agents=not args.no_node_agents,
            trainer=TrainerSettings(survivor_save_s=args.save_on_failure),
        ),
        args.checkpoint_interval,
    )
    rows, sup, alloc, base, fair, walls = [], [], [], [], [], []
    with tempfile.TemporaryDirectory(prefix="ssv-bench-sim-") as tmp:
        for seed in range(args.seeds):
            settings = replace(plan.settings, seed=seed)
            draw = settings.failures.draw(seed, settings.gpus, settings.seconds)
            s, wall = _timed(Simulation(settings, Mode.SUPERVISOR, Path(tmp) / f"seed-{seed}"), draw)
            a, wall_a = _timed(Simulation(settings, Mode.IN_ALLOCATION, Path(tmp) / f"alloc-{seed}"), draw)
            b, wall_b = _timed(Simulation(settings, Mode.BASELINE), draw)
            f, _ = _timed(Simulation(replace(settings, baseline_spares=settings.spares), Mode.BASELINE), draw)
            sup.append(s)
            alloc.append(a)
            base.append(b)
            fair.append(f)
            walls += [wall, wall_a]
            rows.append(
                (
                    seed,
                    len(draw),
                    s.interruptions,
                    f"{s.ettr:.2%}",
                    f"{a.ettr:.2%}",
                    f"{b.ettr:.2%}",
                    f"{f.ettr:.2%}",
                    _q(s.recover_quantile(0.5)),
                    _q(a.recover_quantile(0.5)),
                    _q(f.recover_quantile(0.5)),
                    _swaps(a),
                    _jobs(a),
                    f"{wall:.1f}",
                    f"{wall_a:.1f}",
                    f"{wall_b:.1f}",
                )
            )
            print(
                f"seed {seed}: supervisor ETTR {s.ettr:.2%}, in-allocation {a.ettr:.2%}, baseline {b.ettr:.2%}, "
                f"baseline with {settings.spares} idle nodes {f.ettr:.2%} ({wall:.1f} s, {wall_a:.1f} s, {wall_b:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
    print(table(rows, COLUMNS))
    print(
        f"\nexpected failures per run: {TABLE5_TOTAL * args.gpus / TABLE5_GPUS * args.days / TABLE5_DAYS:.1f}"
        f" (Table 5: {TABLE5_TOTAL} in {TABLE5_DAYS:g} days on {TABLE5_GPUS} GPUs)"
    )
    print("assumed:")
    for key, value in assumptions(plan):
        print(f"  {key}: {value}")
    print(f"  fair baseline: {plan.settings.spares} idle nodes (as many as the supervisor's spares), same checkpoints")
    print("where the time went (hours per run; the rest is checkpoint saves and step noise):")
    for name, results in (("supervisor", sup), ("in-allocation", alloc), ("baseline same spares", fair)):
        print(f"  {name}: " + ", ".join(f"{k} {v / 3600:.1f}" for k, v in _loss(results).items()))
    if args.save_on_failure is not None:
        print("survivors' saves on failure per run (of them torn: stopped before written):")
        for name, results in (("supervisor", sup), ("in-allocation", alloc), ("baseline same spares", fair)):
            saves, torn = _survivors(results)
            print(f"  {name}: {saves:.1f} ({torn:.1f} torn)")
    print(json.dumps(_figures(args, plan, sup, alloc, base, fair, walls)))
    return 0


COLUMNS = (
    "seed",
    "failures",
    "interrupts",
    "ettr_sup",
    "ettr_alloc",
    "ettr_base",
    "ettr_base_spares",
    "recover_p50_sup",
    "recover_p50_alloc",
    "recover_p50_base_spares",
    "swaps",
    "jobs_alloc",
    "wall_sup_s",
    "wall_alloc_s",
    "wall_base_s",
)


def _timed(sim: Simulation, draw: list[Failure]) -> tuple[SimResult, float]:
    started = time.perf_counter()
    result = sim.run(draw)
    return result, time.perf_counter() - started


def _swaps(r: SimResult) -> int:
    """Step generations after the first, over all jobs: the swaps made."""
    return sum(1 for key in r.extra["step_attempts"] if len(key) > 2 and key[2] > 0)  # type: ignore[attr-defined]


def _jobs(r: SimResult) -> int:
    return len({key[0] for key in r.extra["step_attempts"]})  # type: ignore[attr-defined]


def _survivors(results: list[SimResult]) -> tuple[float, float]:
    """Survivors' saves per run, and of them those torn."""
    saves = statistics.fmean(r.extra["survivor_saves"] for r in results)  # type: ignore[misc]
    return saves, statistics.fmean(r.extra["survivor_saves_torn"] for r in results)  # type: ignore[misc]


def _loss(results: list[SimResult]) -> dict[str, float]:
    """The mean loss breakdown, and the wall time not trained."""
    keys = ("detect_s", "restart_s", "rework_s")
    out = {k: statistics.fmean(r.extra["loss_s"][k] for r in results) for k in keys}  # type: ignore[index]
    out["lost_s"] = statistics.fmean(r.wall_s - r.productive_s for r in results)
    return out


def _figures(args, plan, sup, alloc, base, fair, walls) -> dict[str, object]:  # noqa: ANN001
    ettr_s = statistics.fmean(r.ettr for r in sup)
    ettr_a = statistics.fmean(r.ettr for r in alloc)
    return {
        "interruptions_mean": round(statistics.fmean(r.interruptions for r in sup), 1),
        "failures_drawn_mean": round(statistics.fmean(len(r.strikes) for r in sup), 1),
        "ettr_supervisor": round(ettr_s, 4),
        "ettr_in_allocation": round(ettr_a, 4),
        "ettr_baseline": round(statistics.fmean(r.ettr for r in base), 4),
        "ettr_baseline_same_spares": round(statistics.fmean(r.ettr for r in fair), 4),
        "spare_node_hours": round(statistics.fmean(spare_node_hours(r) for r in sup), 1),
        "spare_node_hours_in_allocation": round(statistics.fmean(spare_node_hours(r) for r in alloc), 1),
        "hot_spare_node_hours_in_allocation": round(
            statistics.fmean(r.settings.hot_spares * r.wall_s / 3600.0 for r in alloc), 1
        ),
        "spare_node_hours_baseline_same_spares": round(statistics.fmean(spare_node_hours(r) for r in fair), 1),
        "swaps_mean": round(statistics.fmean(_swaps(r) for r in alloc), 1),
        "jobs_in_allocation_mean": round(statistics.fmean(_jobs(r) for r in alloc), 1),
        "recover_p50_in_allocation_s": _round(quantile(sorted(t for r in alloc for t in r.recover_times()), 0.5)),
        "loss_h_in_allocation": {k: round(v / 3600, 2) for k, v in _loss(alloc).items()},
        "loss_h_supervisor": {k: round(v / 3600, 2) for k, v in _loss(sup).items()},
        "checkpoint_interval_s": round(plan.checkpoint_interval_s),
        **_ceilings(plan, sup, args.days),
        "hot_spares": plan.settings.hot_spares,
        "ettr_supervisor_min": round(min(r.ettr for r in sup), 4),
        "ettr_in_allocation_min": round(min(r.ettr for r in alloc), 4),
        "wall_s_per_run": round(statistics.fmean(walls), 1),
        "cpu_s_per_run": round(statistics.fmean(r.cpu_s for r in (*sup, *alloc)), 1),
        "seeds": args.seeds,
        "days": args.days,
        "goal_ettr_met": ettr_s >= 0.95,
        "goal_ettr_in_allocation_met": ettr_a >= 0.97,
        "goal_wall_met": statistics.fmean(walls) < 60.0,
        "save_on_failure_s": args.save_on_failure,
        **({} if args.save_on_failure is None else _survivor_figures(sup, alloc, fair)),
    }


def _survivor_figures(sup, alloc, fair) -> dict[str, object]:  # noqa: ANN001
    out: dict[str, object] = {"daemon_grace_s": daemon_grace_s(sup[0].settings)}
    for name, results in (("supervisor", sup), ("in_allocation", alloc), ("baseline_same_spares", fair)):
        saves, torn = _survivors(results)
        out[f"survivor_saves_mean_{name}"] = round(saves, 1)
        out[f"survivor_saves_torn_mean_{name}"] = round(torn, 1)
    return out


def _ceilings(plan, sup, days: float) -> dict[str, float]:  # noqa: ANN001
    """What no recovery can beat on these draws: the saves' own cost (``C`` per interval ``tau``)
    and the work since the last save that each interruption loses (half an interval on average),
    with detection, start-up, queue and restore all free (``ettr_ceiling``); and with the restore
    paid (``ettr_ceiling_with_restore``: every recovery loads the checkpoint). A trainer that saves
    on failure loses the half interval only on the interruptions its survivors do not cover; on a
    covered one it loses the survivors' save ``S`` and the step in progress (half a step, ``step_s/2``,
    on average): 1 - C/(tau+C) - r_uncovered (tau+C)/2 - r_covered (S + step_s/2)."""
    trainer = plan.settings.trainer
    save, tau = trainer.save_s, plan.checkpoint_interval_s
    seconds = days * 86400.0
    per_s = statistics.fmean(r.interruptions for r in sup) / seconds
    covered_s = statistics.fmean(_covered(r) for r in sup) / seconds if trainer.survivor_save_s is not None else 0.0
    ceiling = 1.0 - save / (tau + save) - (per_s - covered_s) * (tau + save) / 2.0
    if trainer.survivor_save_s is not None:
        ceiling -= covered_s * (trainer.survivor_save_s + trainer.step_s / 2.0)
    return {
        "ettr_ceiling": round(ceiling, 4),
        "ettr_ceiling_with_restore": round(ceiling - per_s * trainer.restore_s, 4),
    }


def _covered(r: SimResult) -> int:
    """Interruptions the survivors' save covers (one node's ranks die, the others live)."""
    return sum(1 for s in r.strikes if s.interrupted and covers(Manifestation(s.shows)))


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _q(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


if __name__ == "__main__":
    sys.exit(main())
