"""From what a planner asks ("16K GPUs, a checkpoint every 15 min or Young/Daly, 10 s saves") to
``SimSettings``; several seeds in both modes; the figures averaged over seeds; the demo scenario."""

from __future__ import annotations

import math
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from supervisor.domain.health.quarantine import ProbationSettings
from supervisor.sim.faults.failures import DAY_S, TABLE5, Failure, FailureModel, young_daly_interval
from supervisor.sim.faults.fault_trace import FaultTrace
from supervisor.sim.faults.probation_replay import ProbationJudgement, judge_probation
from supervisor.sim.faults.quarantine_replay import QuarantineJudgement, judge
from supervisor.sim.runner import Simulation
from supervisor.sim.training.peer_copies import storage_mtbf_s
from supervisor.sim.training.results import SimResult, quantile
from supervisor.sim.training.settings import Mode, SimSettings
from supervisor.sim.training.survivors import covered_share, covers, daemon_grace_s, lost_work_mtbf_s
from supervisor.sim.training.trainer import TrainerSettings


def checkpoint_steps(
    interval: str | float, trainer: TrainerSettings, model: FailureModel, gpus: int, mtbf_s: float | None = None
) -> tuple[int, float]:
    """Steps between saves for ``interval`` (seconds, or "auto" = Young/Daly from the failure rate
    and the save cost; ``mtbf_s`` the MTBF it trades against instead of the trainer's); returns
    (steps, the interval in seconds it stands for)."""
    if isinstance(interval, str) and interval.strip().lower() == "auto":
        seconds = young_daly_interval(trainer.save_s, mtbf_s or young_daly_mtbf_s(trainer, model, gpus))
    else:
        try:
            seconds = float(interval)
        except ValueError:
            raise ValueError(f"checkpoint interval {interval!r} is neither seconds nor 'auto'") from None
        if seconds <= 0:
            raise ValueError(f"checkpoint interval must be positive seconds or 'auto' (got {interval!r})")
    lines = max(1, round(seconds / trainer.line_s))
    return lines * trainer.log_every, lines * trainer.line_s


def young_daly_mtbf_s(trainer: TrainerSettings, model: FailureModel, gpus: int) -> float:
    """The MTBF Young/Daly trades the saves against: of the failures that lose the work since the
    last save — all of them, or for a trainer that saves on failure those its survivors' save does
    not cover (all of them again when it covers every one: some periodic save is still needed)."""
    if trainer.survivor_save_s is None:
        return model.mtbf_s(gpus)
    losing = lost_work_mtbf_s(model, gpus)
    return losing if math.isfinite(losing) else model.mtbf_s(gpus)


@dataclass(frozen=True)
class Plan:
    settings: SimSettings
    checkpoint_interval_s: float
    checkpoint_source: str  # "auto (Young/Daly)" or "given"


def make_plan(settings: SimSettings, interval: str | float) -> Plan:
    """With peer copies (in-allocation) Young/Daly trades the storage saves against the
    resubmissions only (``peer_copies.storage_mtbf_s``): memory covers every relaunch in the job."""
    mtbf = _peer_mtbf_s(settings) if settings.trainer.peer_copies_steps else None
    steps, seconds = checkpoint_steps(interval, settings.trainer, settings.failures, settings.gpus, mtbf)
    trainer = replace(settings.trainer, checkpoint_steps=steps)
    source = "auto (Young/Daly)" if isinstance(interval, str) and interval.strip().lower() == "auto" else "given"
    return Plan(replace(settings, trainer=trainer), seconds, source)


def run_seeds(
    plan: Plan,
    modes: Sequence[Mode],
    seeds: Sequence[int],
    state_root: Path | None,
    progress: Callable[[str, float], None] | None = None,
    draw: Callable[[SimSettings], list[Failure]] | None = None,
) -> dict[Mode, list[SimResult]]:
    """Every seed in every mode, on the same failure draw per seed (a paired comparison); ``draw``
    gives the failures instead of the settings' model (a replayed fault trace)."""
    out: dict[Mode, list[SimResult]] = {m: [] for m in modes}
    root = state_root or Path(tempfile.mkdtemp(prefix="ssv-sim-"))
    for seed in seeds:
        settings = replace(plan.settings, seed=seed)
        failures = draw(settings) if draw else settings.failures.draw(seed, settings.gpus, settings.seconds)
        for mode in modes:
            state = root if len(seeds) == 1 else root / f"seed-{seed}"
            label = f"{mode.value} seed {seed}"
            tick = (lambda f, label=label: progress(label, f)) if progress else None
            sim = Simulation(settings, mode, state_dir=state if mode.supervised else None, on_progress=tick)
            out[mode].append(sim.run(failures))
    return out


def summary(results: Sequence[SimResult]) -> dict[str, object]:
    """Figures over seeds: means, and the recovery quantiles over every interruption of every seed."""
    recover = sorted(t for r in results for t in r.recover_times())
    causes: dict[str, float] = {}
    for r in results:
        for cause, n in r.by_cause().items():
            causes[cause] = causes.get(cause, 0.0) + n / len(results)
    survivors: dict[str, float] = {}
    if results and results[0].settings.trainer.survivor_save_s is not None:  # only then: the figures stay as they were
        survivors = {
            k: statistics.fmean(_count(r, k) for r in results) for k in ("survivor_saves", "survivor_saves_torn")
        }
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
        "spare_node_hours": statistics.fmean(spare_node_hours(r) for r in results),
        **survivors,
    }


def _count(result: SimResult, key: str) -> int:
    value = result.extra.get(key, 0)
    return value if isinstance(value, int) else 0


def spare_node_hours(result: SimResult) -> float:
    """Idle capacity the run held ready: its spares (supervisor) or the partition's idle nodes
    (baseline), times the hours simulated. A fair comparison gives both modes the same."""
    s = result.settings
    return (s.pool(result.mode) - s.nodes_per_job) * result.wall_s / 3600.0


# -- a replayed fault trace ----------------------------------------------------------------------


def trace_settings(base: SimSettings, trace: FaultTrace, job_nodes: int | None, days: float | None) -> SimSettings:
    """The settings that replay ``trace``: the job is the trace's nodes less the spares unless
    ``job_nodes`` is given, the days the trace covers unless ``days`` is; the failure model is the
    trace's own rate (what Young/Daly and the printed MTBF use)."""
    nodes = job_nodes if job_nodes is not None else len(trace.nodes) - base.spares
    if nodes < 1:
        raise ValueError(
            f"the fault trace names {len(trace.nodes)} nodes and the supervisor has {base.spares} spares: "
            "give --nodes-per-job (or fewer --spares)"
        )
    days = days or max(trace.span_s, 3600.0) / DAY_S
    model = trace.model(nodes, nodes + base.spares, base.gpus_per_node, days * DAY_S)
    return replace(base, gpus=nodes * base.gpus_per_node, days=days, failures=model)


def trace_report(trace: FaultTrace, settings: SimSettings) -> dict[str, object]:
    """What was replayed, and the bad-node memory judged on it: today's quarantine and the
    probation of nodes back from a fault (``sim.faults.probation_replay``)."""
    horizon = settings.seconds
    failures = trace.failures(horizon)
    pool = settings.pool(Mode.SUPERVISOR)
    outside = sum(1 for f in failures if f.category.shows.node_level and (f.node_index or 0) >= pool)
    quarantine, probation = judge(trace, horizon), judge_probation(trace, horizon, ProbationSettings())
    # shares: of the node faults, and of the fleet's node-days (the partition, or the trace's nodes
    # when it names more: every node of the trace was in service)
    fleet_days = max(pool, len(trace.nodes)) * settings.days
    return {
        "source": trace.source,
        "origin": trace.origin,
        "days": round(settings.days, 4),
        "faults": len(failures),
        "nodes": len(trace.nodes),
        "faults_outside_pool": outside,
        "by_cause": trace.by_cause(horizon),
        "quarantine": quarantine.to_json() | _shares(quarantine, fleet_days),
        "probation": probation.to_json() | _shares(probation, fleet_days) | _rule(ProbationSettings()),
    }


def _rule(s: ProbationSettings) -> dict[str, float | int]:
    return {"hold_h": round(s.hold_s / 3600, 2), "max_run_nodes": s.max_run_nodes}


def _shares(j: QuarantineJudgement | ProbationJudgement, fleet_days: float) -> dict[str, float]:
    return {
        "avoided_share": round(j.faults_avoided / j.node_faults, 4) if j.node_faults else 0.0,
        "cost_share": round(j.node_days_held_out_healthy / fleet_days, 4) if fleet_days else 0.0,
    }


def assumptions(plan: Plan) -> list[tuple[str, str]]:
    s, t = plan.settings, plan.settings.trainer
    chain = (
        [("chain of jobs", s.chain.describe())]
        if s.chain.max_job_s or s.chain.queues or s.chain.preempt_per_day
        else []
    )
    return [
        *chain,
        ("failure model", s.failures.source),
        ("MTBF of the job", f"{s.failures.mtbf_s(s.gpus) / 3600:.2f} h ({s.gpus} GPUs)"),
        *_save_on_failure(plan),
        *_peer_copies(plan),
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
        (
            "in-allocation",
            f"{s.hot_spares} hot spare(s) held in the job (--no-kill), the rest of the spares idle; a swap relaunches "
            f"the step after {s.launcher_poll_s + s.step_relaunch_s:g} s (launcher poll + step launch), then the "
            "restore; no hot spare left: resubmission",
        ),
    ]


def _peer_mtbf_s(settings: SimSettings) -> float | None:
    mtbf = storage_mtbf_s(settings.failures, settings.gpus, settings.hot_spares)
    return mtbf if math.isfinite(mtbf) else None


def _peer_copies(plan: Plan) -> list[tuple[str, str]]:
    """The assumption's line when the trainer keeps peer copies in memory (none when it does not)."""
    s, t = plan.settings, plan.settings.trainer
    if not t.peer_copies_steps:
        return []
    mtbf = _peer_mtbf_s(s)
    return [
        (
            "peer copies",
            f"a sharded state (no save on failure); every {t.peer_copies_steps} steps a snapshot to host memory "
            f"stalls the step {t.peer_copy_s:g} s, the buddy's copy is complete {t.peer_exchange_s:g} s later; a "
            f"relaunch in the job restores the newest complete one in {t.peer_restore_s:g} s (storage: "
            f"{t.restore_s:g} s); a new job has none; Young/Daly uses the MTBF of the resubmissions "
            f"(hot spares / node-losing failure rate): {mtbf / 3600 if mtbf else math.inf:.1f} h",
        )
    ]


def _save_on_failure(plan: Plan) -> list[tuple[str, str]]:
    """The assumption's line when the trainer saves on failure (none when it does not)."""
    s, t = plan.settings, plan.settings.trainer
    if t.survivor_save_s is None:
        return []
    return [
        (
            "save on failure",
            f"when one node's ranks die (XID, ECC, NIC: {covered_share(s.failures):.0%} of the failures) the "
            f"survivors save the step in progress in {t.survivor_save_s:g} s and exit, in every mode; the daemon "
            f"holds its recovery up to {daemon_grace_s(s):g} s for it; Young/Daly uses the MTBF of the other "
            f"failures (those that still lose the work since the last save): "
            f"{young_daly_mtbf_s(t, s.failures, s.gpus) / 3600:.2f} h",
        )
    ]


def trace_lines(replay: dict[str, Any]) -> list[str]:
    """``trace_report`` for people."""
    q, p = replay["quarantine"], replay["probation"]
    return [
        f"\nfault trace {replay['source']} (from {replay['origin']}, {replay['days']:g} days):",
        f"  faults replayed: {replay['faults']} on {replay['nodes']} nodes",
        f"  faults on nodes beyond the simulated pool (not replayed): {replay['faults_outside_pool']}",
        f"  node faults: {q['node_faults']}, of them on a node that had faulted before: {q['repeat_faults']}",
        f"  faults avoided by quarantine (the node was quarantined when it faulted again): {q['faults_avoided']}",
        f"  nodes quarantined: {q['nodes_quarantined']}; node-days quarantined: {q['node_days_quarantined']:g}",
        f"  node-days held out while healthy (quarantined, not under repair): {q['node_days_held_out_healthy']:g}",
        f"  quarantine: {q['avoided_share']:.1%} of node faults avoided at {q['cost_share']:.2%} of node-days",
        f"  probation ({p['hold_h']:g} h, runs over {p['max_run_nodes']} nodes): {p['faults_avoided']} faults avoided, "
        f"{p['avoided_share']:.1%} of node faults, at {p['node_days_held_out_healthy']:g} node-days, "
        f"{p['cost_share']:.2%} of node-days",
    ]


# -- the demo: a small cluster, a day, a few faults of different causes --------------------------

DEMO_FAULTS: tuple[tuple[float, str], ...] = (
    (3.0, "Faulty GPU"),  # hours after the start, Table 5 component
    (8.0, "Host Maintenance"),
    (13.0, "NCCL Watchdog Timeouts"),
    (18.0, "Software Bug"),
)


def demo_losing_faults(trainer: TrainerSettings) -> int:
    """The demo's faults that lose the work since the last save (Young/Daly's rate)."""
    if trainer.survivor_save_s is None:
        return len(DEMO_FAULTS)
    cats = {c.component: c for c in TABLE5}
    return max(1, sum(1 for _, name in DEMO_FAULTS if not covers(cats[name].shows)))


def demo_settings(seed: int = 7) -> SimSettings:
    return SimSettings(gpus=128, gpus_per_node=8, spares=2, days=1.0, seed=seed)


def demo_failures(seed: int = 7, faults: Sequence[tuple[float, str]] = DEMO_FAULTS) -> list[Failure]:
    import random

    rng = random.Random(f"demo:{seed}")
    cats = {c.component: c for c in TABLE5}
    return [Failure(hours * 3600.0, cats[name], rng.random(), rng.random(), rng.random()) for hours, name in faults]
