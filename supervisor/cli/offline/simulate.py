"""`slurm-supervisor simulate`: the real engine on a simulated cluster with published failure rates.
Wiring only: the simulation lives in ``supervisor.sim``."""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from supervisor.cli.offline.simulate_chain import chain_lines, chain_options, pop_chain
from supervisor.cli.views import render

if TYPE_CHECKING:  # the simulator is imported when the command runs, not with the CLI
    from supervisor.sim.faults.fault_trace import FaultTrace
    from supervisor.sim.plan import Plan
    from supervisor.sim.training.results import SimResult
    from supervisor.sim.training.settings import Mode, SimSettings


def _fmt_s(value: object) -> str:
    return "-" if value is None else f"{float(value):.0f} s"  # type: ignore[arg-type]


@click.command()
@click.option("--gpus", type=int, default=None, help="GPUs the run's job uses. [default: 16384, demo: 128]")
@click.option("--gpus-per-node", type=int, default=8, show_default=True)
@click.option("--nodes-per-job", type=int, default=None, help="Instead of --gpus: nodes the job uses.")
@click.option("--spares", type=int, default=None, help="Named spare nodes for the supervisor. [default: 64, demo: 2]")
@click.option(
    "--baseline-spares",
    default="same",
    show_default=True,
    help='Idle nodes in the partition in baseline mode: a number, or "same" as the supervisor\'s spares '
    "(a fair comparison: the same idle capacity).",
)
@click.option("--days", type=float, default=None, help="Simulated days. [default: 54, demo: 1]")
@click.option(
    "--checkpoint-interval",
    default="auto",
    show_default=True,
    help='Seconds of training between saves, or "auto" (Young/Daly from the failure rate and save cost).',
)
@click.option(
    "--save-cost",
    type=float,
    default=5.0,
    show_default=True,
    help="Seconds one save blocks training (an asynchronous save stalls only to stage to host memory).",
)
@click.option("--restore-cost", type=float, default=60.0, show_default=True, help="Seconds to load a checkpoint.")
@click.option(
    "--startup-cost",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds from job start to training (launch, NCCL init), before the restore.",
)
@click.option("--step-time", type=float, default=6.0, show_default=True, help="Seconds per training step.")
@click.option(
    "--save-on-failure",
    type=float,
    default=None,
    metavar="SECONDS",
    help="The trainer saves on failure: when one node's ranks die (XID, ECC, NIC) the survivors save the "
    "step in progress, taking SECONDS, and exit (every mode); the daemon holds its recovery for it. [default: off]",
)
@click.option("--seed", type=int, default=0, show_default=True, help="First seed of the failure draw.")
@click.option("--seeds", type=int, default=1, show_default=True, help="Number of seeds (seed, seed+1, ...).")
@click.option(
    "--baseline", "only_baseline", is_flag=True, help="Only the baseline: plain Slurm requeue, no supervisor."
)
@click.option("--compare", is_flag=True, help="Both the supervisor and the baseline, on the same failure draws.")
@click.option(
    "--mode",
    "restart_mode",
    type=click.Choice(["resubmit", "in-allocation"]),
    default="resubmit",
    show_default=True,
    help="The supervisor's recovery: resubmit the job, or swap hot spares in the job.",
)
@click.option(
    "--hot-spares", type=int, default=None, help="In-allocation: spares held in the job. [default: 16, demo: 1]"
)
@click.option("--poll-interval", type=float, default=5.0, show_default=True, help="The daemon's poll interval (s).")
@click.option(
    "--hang-multiple",
    type=float,
    default=5.0,
    show_default=True,
    help="A run is hung after this many learned step intervals without progress.",
)
@click.option("--nccl-timeout", type=float, default=600.0, show_default=True, help="NCCL watchdog timeout (s).")
@click.option("--slurmd-timeout", type=float, default=300.0, show_default=True, help="Slurm's SlurmdTimeout (s).")
@click.option("--reboot-minutes", type=float, default=15.0, show_default=True, help="Median node reboot time.")
@click.option("--replace-hours", type=float, default=4.0, show_default=True, help="Median part/node replacement time.")
@click.option(
    "--titan-trace",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="GPU failures from the ORNL Titan trace (gc_full.csv) instead of Llama 3's Table 5.",
)
@click.option(
    "--fault-trace",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="Replay a site's fault trace (JSON or CSV: node, start, end, cause; docs/fault-trace.md) "
    "instead of drawing failures; also judges the bad-node memory (quarantine) on it.",
)
@click.option(
    "--node-agents/--no-node-agents",
    default=True,
    show_default=True,
    help="The engine reads simulated node agents' findings (XID, ECC, IB port) through HealthFeed.",
)
@chain_options
@click.option("--demo", is_flag=True, help="The README demo: 16 nodes, 1 day, four faults of different causes.")
@click.option(
    "--state-dir",
    "state_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where the supervisor's store (the logbook) goes. [default: a new temporary directory]",
)
@click.option(
    "--logbook/--no-logbook",
    "show_logbook",
    default=None,
    help="Print the logbook at the end. [default: on with --demo]",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as one JSON object.")
@click.option(
    "--progress/--no-progress",
    "show_progress",
    default=None,
    help="A progress bar. [default: when stderr is a terminal]",
)
def simulate(**options: Any) -> None:
    """Simulate a long run on a simulated cluster: the real engine against published failure rates.

    Prints ETTR, interruptions by cause, lost GPU-hours and time to recover, with the assumed
    costs, and leaves the supervisor's logbook in a state directory
    (`slurm-supervisor --state-dir DIR logbook llama3-405b`)."""
    from supervisor.adapters.logging import configure_logging

    configure_logging("warning", "auto")
    chain = pop_chain(options)
    o = _Options(**options, chain=chain)
    trace = _trace(o)
    plan = _plan(o, trace)
    root = Path(o.state_dir) if o.state_dir else Path(tempfile.mkdtemp(prefix="ssv-sim-"))
    results = _simulate(o, plan, root, trace)
    supervised = results[o.supervisor][0].run if o.supervisor in results else None
    _report(o, plan, results, root, supervised, trace)
    if (o.show_logbook if o.show_logbook is not None else o.demo) and supervised is not None:
        _print_logbook(_state_dir(o, root), supervised)


@dataclass(frozen=True)
class _Options:
    """The command's options, one field per option (the names click passes)."""

    gpus: int | None
    gpus_per_node: int
    nodes_per_job: int | None
    spares: int | None
    baseline_spares: str
    days: float | None
    checkpoint_interval: str
    save_cost: float
    restore_cost: float
    startup_cost: float
    step_time: float
    save_on_failure: float | None
    seed: int
    seeds: int
    only_baseline: bool
    compare: bool
    restart_mode: str
    hot_spares: int | None
    poll_interval: float
    hang_multiple: float
    nccl_timeout: float
    slurmd_timeout: float
    reboot_minutes: float
    replace_hours: float
    titan_trace: str | None
    fault_trace: str | None
    node_agents: bool
    demo: bool
    state_dir: str | None
    show_logbook: bool | None
    as_json: bool
    show_progress: bool | None
    chain: Any  # sim.training.chain.ChainSettings: the time limit, the queue, preemption

    @property
    def modes(self) -> list[Mode]:
        from supervisor.sim.training.settings import Mode

        if self.only_baseline:
            return [Mode.BASELINE]
        return [self.supervisor, Mode.BASELINE] if self.compare else [self.supervisor]

    @property
    def supervisor(self) -> Mode:
        from supervisor.sim.training.settings import Mode

        return Mode.IN_ALLOCATION if self.restart_mode == "in-allocation" else Mode.SUPERVISOR


def _trace(o: _Options) -> FaultTrace | None:
    """The fault trace to replay, loaded and checked; a usage error says what is wrong with it."""
    from supervisor.sim.faults import fault_trace

    if o.fault_trace is None:
        return None
    if o.titan_trace or o.demo:
        raise click.UsageError("give --fault-trace or --titan-trace/--demo, not both")
    try:
        return fault_trace.load(o.fault_trace)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _plan(o: _Options, trace: FaultTrace | None) -> Plan:
    """The simulation's settings and checkpoint interval; a usage error names a bad option."""
    from supervisor.sim import plan as planning
    from supervisor.sim.faults.failures import young_daly_interval

    if o.nodes_per_job is not None and o.gpus is not None:
        raise click.UsageError("give --gpus or --nodes-per-job, not both")
    if o.seeds < 1:
        raise click.UsageError("--seeds must be 1 or more")
    try:
        settings = _settings(o)
        if trace is not None:
            job = o.nodes_per_job if o.gpus is None else o.gpus // o.gpus_per_node
            settings = planning.trace_settings(settings, trace, job, o.days)
        interval = o.checkpoint_interval
        if o.demo and interval == "auto":  # Young/Daly for the demo's own fault rate, not Table 5's
            mtbf = settings.seconds / planning.demo_losing_faults(settings.trainer)
            interval = str(round(young_daly_interval(settings.trainer.save_s, mtbf)))
        return planning.make_plan(settings, interval)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _settings(o: _Options) -> SimSettings:
    """The options over the defaults (the README demo's, with --demo)."""
    from supervisor.sim.faults.failures import FailureModel, RepairTimes, titan_model
    from supervisor.sim.plan import demo_settings
    from supervisor.sim.training.settings import SimSettings
    from supervisor.sim.training.trainer import TrainerSettings

    base = demo_settings(o.seed) if o.demo else SimSettings()
    spares = base.spares if o.spares is None else o.spares
    gpus = o.nodes_per_job * o.gpus_per_node if o.nodes_per_job is not None else o.gpus
    model = titan_model(o.titan_trace) if o.titan_trace else FailureModel()
    trainer = TrainerSettings(
        step_s=o.step_time,
        save_s=o.save_cost,
        restore_s=o.restore_cost,
        startup_s=o.startup_cost,
        survivor_save_s=o.save_on_failure,
    )
    return replace(
        base,
        gpus=gpus or base.gpus,
        gpus_per_node=o.gpus_per_node,
        spares=spares,
        hot_spares=o.hot_spares if o.hot_spares is not None else (1 if o.demo else base.hot_spares),
        baseline_spares=_baseline_spares(o.baseline_spares, spares),
        days=o.days or base.days,
        seed=o.seed,
        trainer=trainer,
        failures=model,
        repair=RepairTimes(o.reboot_minutes * 60.0, o.replace_hours * 3600.0),
        poll_interval_s=o.poll_interval,
        hang_multiple=o.hang_multiple,
        nccl_timeout_s=o.nccl_timeout,
        slurmd_timeout_s=o.slurmd_timeout,
        node_agents=o.node_agents,
        chain=o.chain,
    )


def _baseline_spares(value: str, spares: int) -> int:
    if value.strip().lower() == "same":
        return spares
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"--baseline-spares {value!r} is neither a number nor 'same'") from None


def _simulate(o: _Options, plan: Plan, root: Path, trace: FaultTrace | None) -> dict[Mode, list[SimResult]]:
    """Every mode on the same failure draws: the demo's four faults, or each seed's draw."""
    from supervisor.sim import plan as planning
    from supervisor.sim.runner import Simulation

    progress = sys.stderr.isatty() if o.show_progress is None else o.show_progress
    with render.progress_bar(progress and not o.as_json) as bar:
        if o.demo:
            draw = planning.demo_failures(o.seed)
            return {m: [Simulation(plan.settings, m, root if m.supervised else None).run(draw)] for m in o.modes}
        replay = None if trace is None else (lambda s: trace.failures(s.seconds))
        return planning.run_seeds(plan, o.modes, list(range(o.seed, o.seed + o.seeds)), root, bar, replay)


def _report(
    o: _Options,
    plan: Plan,
    results: dict[Mode, list[SimResult]],
    root: Path,
    supervised: str | None,
    trace: FaultTrace | None,
) -> None:
    """The figures, as one JSON object or as a table with the assumptions and where the logbook is."""
    from supervisor.sim import plan as planning
    from supervisor.sim.training.time_limits import chain_summary

    figures = {m.value: planning.summary(rs) for m, rs in results.items()}
    for m, rs in results.items():
        if any("chain" in r.extra for r in rs):
            figures[m.value]["chain"] = chain_summary([r.extra.get("chain") for r in rs])
    replay = None if trace is None else planning.trace_report(trace, plan.settings)
    if o.as_json:
        doc = {
            "figures": figures,
            "assumptions": dict(planning.assumptions(plan)),
            "state_dir": str(root) if supervised is not None else None,
        }
        if replay is not None:
            doc["fault_trace"] = replay
        click.echo(json.dumps(doc, default=str))
        return
    _print(plan, figures, planning.assumptions(plan))
    for line in chain_lines(figures):
        click.echo(line)
    for line in planning.trace_lines(replay) if replay is not None else ():
        click.echo(line)
    if supervised is not None:
        click.echo(f"\nlogbook: slurm-supervisor --state-dir {_state_dir(o, root)} logbook {supervised}")


def _state_dir(o: _Options, root: Path) -> Path:
    """Where the first seed's store is: the root itself, or its seed-N folder when several seeds ran."""
    return root if o.seeds == 1 or o.demo else root / f"seed-{o.seed}"


def _print(plan: object, figures: dict[str, dict[str, object]], assumed: list[tuple[str, str]]) -> None:
    rows: list[tuple[str, Callable[[dict[str, object]], str]]] = [
        ("ETTR (mean over seeds)", lambda f: f"{float(f['ettr']):.2%}"),  # type: ignore[arg-type]
        ("unexpected interruptions", lambda f: f"{float(f['interruptions']):.1f}"),  # type: ignore[arg-type]
        ("lost GPU-hours", lambda f: f"{float(f['lost_gpu_hours']):,.0f}"),  # type: ignore[arg-type]
        ("time to recover p50", lambda f: _fmt_s(f["recover_p50_s"])),
        ("time to recover p90", lambda f: _fmt_s(f["recover_p90_s"])),
        ("attempts (incarnations)", lambda f: f"{float(f['attempts']):.0f}"),  # type: ignore[arg-type]
        ("restarts that died on a broken GPU", lambda f: f"{float(f['crash_restarts']):.1f}"),  # type: ignore[arg-type]
        ("restarts from a torn checkpoint", lambda f: f"{float(f['torn_restarts']):.1f}"),  # type: ignore[arg-type]
    ]
    modes = list(figures)
    width = max(len(r[0]) for r in rows) + 2
    click.echo("".ljust(width) + "".join(m.rjust(14) for m in modes))
    for label, fmt in rows:
        click.echo(label.ljust(width) + "".join(fmt(figures[m]).rjust(14) for m in modes))
    click.echo("\ninterruptions by cause (mean per run):")
    by_cause = {m: cast(dict[str, float], figures[m]["by_cause"]) for m in modes}
    causes = sorted(  # most first, ties by name: the same output every time (a set's order is not)
        {c for b in by_cause.values() for c in b}, key=lambda c: (-max(b.get(c, 0.0) for b in by_cause.values()), c)
    )
    for cause in causes:
        click.echo(
            f"  {cause}".ljust(width) + "".join(f"{float(by_cause[m].get(cause, 0.0)):.1f}".rjust(14) for m in modes)
        )
    click.echo("\nassumed:")
    for key, value in assumed:
        click.echo(f"  {key}: {value}")


def _print_logbook(state_dir: Path, run: str) -> None:
    from supervisor.adapters.sqlite import SqliteStore

    store = SqliteStore(state_dir)
    try:
        from supervisor.cli.views.logbook_view import folded_lines

        click.echo("\nLOGBOOK")
        for line in folded_lines(store.events(run)):
            click.echo(line)
        verdicts = store.verdicts()
        if verdicts:
            click.echo("\nNODES")
            for line in render.node_lines(verdicts):
                click.echo(line)
    finally:
        store.close()
