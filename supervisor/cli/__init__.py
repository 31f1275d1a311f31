"""`slurm-supervisor`: the daemon and the commands engineers run. Wiring only."""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from supervisor.cli import render, wiring
from supervisor.config import ConfigError, DaemonConfig, check_partition, load_daemon_config, load_run_spec
from supervisor.domain.records import Event, EventKind
from supervisor.ports import PortError

DEFAULT_CONFIG = "/etc/slurm-supervisor/supervisor.toml"


def _config(ctx: click.Context) -> DaemonConfig:
    obj: dict[str, Any] = ctx.ensure_object(dict)
    if "cfg" not in obj:
        path = obj.get("config_path")
        if path is None and Path(DEFAULT_CONFIG).exists():
            path = DEFAULT_CONFIG
        try:
            cfg = load_daemon_config(path)
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from None
        if obj.get("state_dir"):
            cfg = cfg.model_copy(update={"daemon": cfg.daemon.model_copy(update={"state_dir": obj["state_dir"]})})
        obj["cfg"] = cfg
    return obj["cfg"]  # type: ignore[no-any-return]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    envvar="SLURM_SUPERVISOR_CONFIG",
    help=f"Daemon configuration (TOML). Default: {DEFAULT_CONFIG} when it exists.",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False),
    envvar="SLURM_SUPERVISOR_STATE_DIR",
    help="Override daemon.state_dir.",
)
@click.pass_context
def main(ctx: click.Context, config_path: str | None, state_dir: str | None) -> None:
    """Keep long Slurm training runs alive: follow jobs, recover from node faults, keep a logbook."""
    ctx.ensure_object(dict).update(config_path=config_path, state_dir=state_dir)


@main.command()
@click.option(
    "--config",
    "daemon_config",
    type=click.Path(dir_okay=False),
    default=None,
    help="Daemon configuration (same as the global --config).",
)
@click.option("--once", is_flag=True, help="Run one reconcile tick and exit.")
@click.option(
    "--crash-at", hidden=True, default=None, help="Fault injection for tests: BOUNDARY[:ACTION] — exit abruptly there."
)
@click.pass_context
def daemon(ctx: click.Context, daemon_config: str | None, once: bool, crash_at: str | None) -> None:
    """Run the supervisor daemon (systemd: Type=notify)."""
    if daemon_config:
        ctx.ensure_object(dict)["config_path"] = daemon_config
    from supervisor.adapters.lock import AlreadyRunning, StateDirLock
    from supervisor.adapters.logging import configure_logging
    from supervisor.adapters.sdnotify import SystemdNotifier, WatchdogTimer
    from supervisor.adapters.tcp_probe import TcpProbe
    from supervisor.engine.daemon import Heartbeat, Pacing, StampedScheduler, run_loop
    from supervisor.engine.reconcile import Engine

    cfg = _config(ctx)
    configure_logging(cfg.logging.level, cfg.logging.format)
    clock = wiring.clock()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: clock.stop())
    try:
        with StateDirLock(cfg.daemon.state_dir):
            store = wiring.store(cfg)
            ingest = wiring.ingest(cfg, clock)
            settings = wiring.engine_settings(cfg)
            heartbeat = Heartbeat()  # the loop's sign of life for the watchdog's own timer
            if ingest is not None:
                try:
                    ingest[1].start()
                except OSError as exc:
                    raise click.ClickException(f"{exc}; set [ingest] port (or enabled = false)") from None
                settings = replace(settings, ingest_url=wiring.advertised_url(cfg, ingest[1]))
            engine = Engine(
                scheduler=StampedScheduler(wiring.scheduler(cfg), heartbeat),
                store=store,
                clock=clock,
                settings=settings,
                probe=TcpProbe(timeout=cfg.probe.timeout_s) if cfg.probe.enabled else None,
                fencer=wiring.fencer(cfg),
                crash_hook=_crash_hook(crash_at),
                progress=wiring.progress(cfg),
                checkpoints=wiring.checkpoints(clock),
                health=ingest[0] if ingest else None,
            )
            try:
                paging = wiring.pager(cfg, store, clock)
            except (OSError, ValueError) as exc:
                raise click.ClickException(str(exc)) from None
            if paging is not None:
                paging[0].start()
            notifier = SystemdNotifier()
            try:
                with WatchdogTimer(notifier, heartbeat, cfg.daemon.stall_limit_s):
                    run_loop(
                        engine,
                        Pacing(cfg.daemon.poll_interval_s),
                        notifier,
                        max_ticks=1 if once else None,
                        after_tick=paging[1] if paging else None,
                        heartbeat=heartbeat,
                    )
            finally:
                if paging is not None:
                    paging[0].close()
                if ingest is not None:
                    ingest[1].stop()
    except AlreadyRunning as exc:
        raise click.ClickException(str(exc)) from None


def _crash_hook(spec: str | None) -> Any:
    if not spec:
        return None
    boundary, _, kind = spec.partition(":")

    def hook(at: str, action: str) -> None:
        if at == boundary and (not kind or kind == action):
            sys.stderr.write(f"slurm-supervisor: injected crash at {at}:{action}\n")
            sys.stderr.flush()
            os._exit(137)

    return hook


@main.command()
@click.argument("spec_path", metavar="RUN.toml", type=click.Path(dir_okay=False))
@click.option("--no-slurm-check", is_flag=True, help="Do not ask Slurm whether the partition exists.")
@click.pass_context
def submit(ctx: click.Context, spec_path: str, no_slurm_check: bool) -> None:
    """Register a run; the daemon submits its job on its next tick."""
    cfg = _config(ctx)
    try:
        spec = load_run_spec(spec_path)
        if not no_slurm_check:
            snap = wiring.scheduler(cfg).snapshot()
            check_partition(spec, {p for n in snap.nodes.values() for p in n.partitions})
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    except PortError as exc:
        raise click.ClickException(
            f"could not ask Slurm about partition {spec.partition!r}: {exc}. "
            "Fix: check that slurmctld is up, or pass --no-slurm-check"
        ) from None
    store = wiring.store(cfg)
    now = wiring.clock().now()
    try:
        with store.transaction():
            store.add_run(spec, now)
            store.record_event(
                Event(
                    spec.name,
                    EventKind.REGISTERED,
                    f"run registered by {_user()}: {spec.nodes} nodes on {spec.partition}, "
                    f"up to {spec.max_restarts} restarts",
                    f"{spec.name}:registered:{now:.6f}",
                    now,
                    actor=_user(),
                    evidence={"spec": str(Path(spec_path).resolve())},
                )
            )
    except PortError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"run {spec.name} registered; the daemon submits it on its next tick")


@main.command()
@click.argument("run", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def status(ctx: click.Context, run: str | None, as_json: bool) -> None:
    """Show supervised runs (all, or one with its attempts)."""
    store = wiring.store(_config(ctx))
    runs = store.runs()
    if run is not None:
        runs = [r for r in runs if r.name == run]
        if not runs:
            raise click.ClickException(f"unknown run {run!r}; `slurm-supervisor status` lists the runs")
    if as_json:
        click.echo(json.dumps([render.run_dict(r, store.attempts(r.name)) for r in runs], indent=2))
        return
    for line in render.status_lines(runs):
        click.echo(line)


class _LogbookGroup(click.Group):
    """`logbook RUN [options]` shows a logbook; `logbook note RUN TEXT` adds a signed note."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] in self.commands:
            return super().resolve_command(ctx, args)
        return "show", self.commands["show"], args


@main.group(cls=_LogbookGroup, context_settings={"ignore_unknown_options": True})
def logbook() -> None:
    """A run's logbook: `logbook RUN` prints it, `logbook note RUN TEXT` adds a note,
    `logbook goodput RUN` accounts for its time."""


_WHEN = "UTC ISO time (2026-11-29T03:00) or a span back from now (90m, 2h, 1d)"


@logbook.command("show")
@click.argument("run", required=False)
@click.option("--evidence", is_flag=True, help="Show each event's evidence.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "markdown", "json", "html"]),
    default="text",
    show_default=True,
    help="text: one line per event; markdown: the OPT-style chronicle; json: JSON "
    "lines; html: one self-contained page (timeline, curves, lost time by cause, chronicle).",
)
@click.option("--json", "as_json", is_flag=True, help="Export the events as JSON lines (same as --format json).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write to FILE, not stdout.")
@click.option("--since", default=None, help=f"Events from then on: {_WHEN}.")
@click.option("--until", default=None, help=f"Events up to then: {_WHEN}.")
@click.option("--kind", "kinds", multiple=True, help="Only these kinds (repeat the option for more).")
@click.option("--node", "nodes", multiple=True, help="Only events about these nodes (repeat for more).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new events until Ctrl-C.")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    help="Seconds between reads of the store with --follow.",
)
@click.pass_context
def logbook_show(
    ctx: click.Context,
    run: str | None,
    evidence: bool,
    fmt: str,
    as_json: bool,
    output: str | None,
    since: str | None,
    until: str | None,
    kinds: tuple[str, ...],
    nodes: tuple[str, ...],
    follow: bool,
    interval: float,
) -> None:
    """Print a run's logbook (`logbook RUN` is short for `logbook show RUN`; no RUN: every run's events)."""
    from rich.console import Console

    fmt = "json" if as_json else fmt
    store = wiring.store(_config(ctx))
    record = store.get_run(run) if run is not None else None
    if run is not None and record is None:
        raise click.ClickException(f"unknown run {run!r}; `slurm-supervisor status` lists the runs")
    clock = wiring.clock()
    filt = _event_filter(since, until, kinds, nodes, clock.now())
    if fmt in ("markdown", "html"):
        if record is None:
            raise click.ClickException(
                f"--format {fmt} shows one run: name it, e.g. `slurm-supervisor logbook "
                f"llama-70b --format {fmt} -o llama-70b.{'md' if fmt == 'markdown' else 'html'}`"
            )
        if filt.active or follow:
            raise click.ClickException(
                "--since, --until, --kind, --node and --follow apply to --format text and "
                f"json; --format {fmt} shows the whole run"
            )
        _write(output, _document(fmt, record, store, clock.now()))
        return
    if follow and output:
        raise click.ClickException("--follow writes to the terminal; drop -o/--output (or redirect stdout)")
    out = open(output, "w", encoding="utf-8") if output else None  # noqa: SIM115 - closed below
    console = Console(file=out, soft_wrap=True, highlight=False, markup=False, emoji=False)

    def emit(events: list[Event]) -> None:
        if fmt == "json":
            for e in events:
                if filt.matches(e):
                    console.out(render.json_line(e), highlight=False)
        else:
            render.print_events(console, events, filt, evidence=evidence)

    try:
        events = store.events(run)
        emit(events)
        if follow:
            _follow(lambda: store.events(run), emit, clock, interval, len(events))
    finally:
        if out is not None:
            out.close()


def _event_filter(
    since: str | None, until: str | None, kinds: tuple[str, ...], nodes: tuple[str, ...], now: float
) -> render.EventFilter:
    known = {k.value for k in EventKind}
    unknown = sorted(set(kinds) - known)
    if unknown:
        raise click.ClickException(
            f"unknown event kind(s) {', '.join(unknown)}; known kinds: {', '.join(sorted(known))}"
        )
    try:
        lo = render.parse_when(since, now) if since else None
        hi = render.parse_when(until, now) if until else None
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if lo is not None and hi is not None and hi < lo:
        raise click.ClickException(f"--until ({until}) is before --since ({since}); swap them")
    return render.EventFilter(lo, hi, frozenset(kinds), frozenset(nodes))


def _follow(read: Any, emit: Any, clock: Any, interval: float, seen: int) -> None:
    """Follow until Ctrl-C (or SIGTERM): the signal stops the clock's wait, and the command exits 0."""
    handlers = {sig: signal.signal(sig, lambda *_: clock.stop()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        render.follow(read, emit, clock, interval, skip=seen)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def _document(fmt: str, record: Any, store: Any, now: float) -> str:
    attempts, events = store.attempts(record.name), store.events(record.name)
    until = now if not record.state.terminal else None
    if fmt == "markdown":
        from supervisor.domain.chronicle import render_markdown

        return str(render_markdown(record, attempts, events, now=until))
    from supervisor.adapters.html_logbook import render_html

    return render_html(record, attempts, events, now=until)


def _write(output: str | None, text: str) -> None:
    if output is None:
        click.echo(text, nl=False)
        return
    try:
        Path(output).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise click.ClickException(f"cannot write {output}: {exc.strerror}; choose a writable path") from None
    click.echo(f"wrote {output} ({len(text.encode()):,} bytes)", err=True)


@logbook.command("goodput")
@click.argument("run")
@click.option("--since", default=None, help=f"Window start: {_WHEN}.")
@click.option("--until", default=None, help=f"Window end: {_WHEN}.")
@click.option(
    "--window",
    "window_h",
    type=click.FloatRange(min=0.01),
    default=None,
    help="Also show the ETTR per window of this many hours.",
)
@click.option(
    "--save-s",
    type=click.FloatRange(min=0.0, min_open=True),
    default=None,
    help="Checkpoint save cost in seconds for the interval advice (default: the logbook's save_s).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def logbook_goodput(
    ctx: click.Context,
    run: str,
    since: str | None,
    until: str | None,
    window_h: float | None,
    save_s: float | None,
    as_json: bool,
) -> None:
    """Effective training time ratio (ETTR), lost time by cause, interruption rate, checkpoint advice."""
    from supervisor.domain.chronicle import last_record
    from supervisor.domain.goodput import goodput, measured_save_s, windows
    from supervisor.domain.goodput_text import gpus_of

    store = wiring.store(_config(ctx))
    record = store.get_run(run)
    if record is None:
        raise click.ClickException(f"unknown run {run!r}; `slurm-supervisor status` lists the runs")
    attempts, events = store.attempts(run), store.events(run)
    now = max(wiring.clock().now(), last_record(attempts, events))
    filt = _event_filter(since, until, (), (), now)
    g = goodput(run, attempts, events, now=now, start=filt.since, end=filt.until)
    advice = g.advice(save_s if save_s is not None else measured_save_s(events))
    parts = windows(run, attempts, events, now=now, width_s=window_h * 3600) if window_h else []
    if as_json:
        click.echo(json.dumps(render.goodput_dict(g, advice, parts), indent=2))
        return
    for line in render.goodput_lines(g, advice, parts, gpus_of(record.spec)):
        click.echo(line)


@logbook.command("note")
@click.argument("run")
@click.argument("text")
@click.pass_context
def logbook_note(ctx: click.Context, run: str, text: str) -> None:
    """Add a note to RUN's logbook, signed with your Unix user."""
    if not text.strip():
        raise click.ClickException('the note is empty; write what happened, e.g. "replaced GPU 3 on gpu-117"')
    store = wiring.store(_config(ctx))
    record = store.get_run(run)
    if record is None:
        raise click.ClickException(f"unknown run {run!r}; `slurm-supervisor status` lists the runs")
    now, user, a = wiring.clock().now(), _user(), record.attempt
    store.record_event(
        Event(
            run,
            EventKind.NOTE,
            text.strip(),
            f"{run}:note:{now:.6f}:{user}",
            now,
            a.seq if a else None,
            a.job_id if a else None,
            actor=user,
        )
    )
    click.echo(f"note added to the logbook of run {run}, signed {user}")


@main.command()
@click.pass_context
def nodes(ctx: click.Context) -> None:
    """Nodes the supervisor drained or excluded, with the evidence."""
    verdicts = wiring.store(_config(ctx)).verdicts()
    if not verdicts:
        click.echo("no node has been drained or excluded")
        return
    for line in render.node_lines(verdicts):
        click.echo(line)


@main.command()
@click.argument("run")
@click.pass_context
def cancel(ctx: click.Context, run: str) -> None:
    """Cancel a run: the daemon cancels its job and stops supervising it."""
    store = wiring.store(_config(ctx))
    try:
        store.request_cancel(run, wiring.clock().now())
    except PortError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"cancel of run {run} requested; the daemon cancels its job on its next tick")


@main.command()
@click.option("--nodes", "total_nodes", default=20, show_default=True, help="Nodes in the simulated partition.")
@click.option("--run-nodes", default=16, show_default=True, help="Nodes the run needs.")
@click.option("--spares", default=2, show_default=True, help="Named spare nodes.")
@click.option("--hours", default=24.0, show_default=True, help="Simulated hours.")
@click.option("--crashes", default=3, show_default=True, help="Node crashes to inject.")
@click.option("--seed", default=7, show_default=True)
@click.option(
    "--state-dir",
    "demo_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Keep the demo's store here (default: a temporary directory).",
)
def demo(
    total_nodes: int, run_nodes: int, spares: int, hours: float, crashes: int, seed: int, demo_dir: str | None
) -> None:
    """The daemon supervising a run on a simulated cluster with injected node crashes."""
    from supervisor.adapters.logging import configure_logging
    from supervisor.sim.demo import DemoSettings, run_demo

    configure_logging("warning", "auto")
    o = run_demo(DemoSettings(total_nodes, run_nodes, spares, hours, crashes, seed), demo_dir)
    s = o.settings
    click.echo(
        f"simulated {s.hours:g} h of a {s.run_nodes}-node run with {s.spares} named spares on "
        f"{s.total_nodes} nodes: {o.ticks} daemon ticks in {o.wall_s:.1f} s of wall time"
    )
    click.echo(
        f"injected node crashes: {', '.join(o.injected) or 'none'}; recoveries: {o.recoveries}; "
        f"overlapping incarnations: {o.overlaps}"
    )
    click.echo(
        f"run state: {o.run.state.value}; restarts spent: {o.run.restarts_spent}/{o.run.spec.max_restarts}; "
        f"excluded: {', '.join(sorted(o.run.excluded)) or 'none'}\n"
    )
    click.echo("LOGBOOK")
    for line in render.logbook_lines(o.events):
        click.echo(line)
    click.echo("\nNODES")
    for line in render.node_lines(o.verdicts):
        click.echo(line)
    ok = o.recoveries >= min(1, len(o.injected)) and o.overlaps == 0
    sys.exit(0 if ok else 1)


def _user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


from supervisor.cli.ckpt import ckpt  # noqa: E402

main.add_command(ckpt)


from supervisor.cli.agent import agent  # noqa: E402

main.add_command(agent)


from supervisor.cli.quarantine import quarantine  # noqa: E402

main.add_command(quarantine)


from supervisor.cli.hooks import hook  # noqa: E402

main.add_command(hook)

from supervisor.cli.simulate import simulate  # noqa: E402

main.add_command(simulate)
