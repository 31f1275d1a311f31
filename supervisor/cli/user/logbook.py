"""`slurm-supervisor logbook`: print a run's logbook (text, JSON lines, the Markdown chronicle or one
HTML page), follow it, add a signed note, and account for the run's time (goodput)."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from supervisor.api.client import Reader, RemoteStore
from supervisor.cli import context, wiring
from supervisor.cli.views import render
from supervisor.domain.records import Event, EventKind

if TYPE_CHECKING:
    from rich.console import Console

    from supervisor.adapters.clock import SystemClock
    from supervisor.domain.progress.series import ProgressPoint
    from supervisor.domain.records import AttemptRecord, RunRecord


class _LogbookGroup(click.Group):
    """`logbook RUN [options]` shows a logbook; `logbook note RUN TEXT` adds a signed note."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] in self.commands:
            return super().resolve_command(ctx, args)
        return "show", self.commands["show"], args


@click.group(cls=_LogbookGroup, context_settings={"ignore_unknown_options": True})
def logbook() -> None:
    """A run's logbook: `logbook RUN` prints it, `logbook note RUN TEXT` adds a note,
    `logbook goodput RUN` accounts for its time."""


_WHEN = "UTC ISO time (2026-11-29T03:00) or a span back from now (90m, 2h, 1d)"


@logbook.command("show")
@click.argument("run", required=False)
@click.option("--evidence", is_flag=True, help="Show each event's evidence.")
@click.option(
    "--all",
    "every_line",
    is_flag=True,
    help="Every event on a line of its own (text format); by default runs of routine events, such as "
    "checkpoint verifications, are folded into one line and incidents are set apart.",
)
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
    every_line: bool,
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
    fmt = "json" if as_json else fmt
    store = context.reader(ctx)
    record = store.get_run(run) if run is not None else None
    if run is not None and record is None:
        raise context.unknown_run(run)
    clock = wiring.clock()
    filt = _event_filter(since, until, kinds, nodes, clock.now())
    if fmt in ("markdown", "html"):
        _write(output, _document(fmt, _whole_run(fmt, record, filt.active or follow), store, clock.now()))
        return
    if follow and output:
        raise click.ClickException("--follow writes to the terminal; drop -o/--output (or redirect stdout)")
    out = open(output, "w", encoding="utf-8") if output else None  # noqa: SIM115 - closed below
    try:
        emit = _emitter(_console(out), fmt, filt, evidence, fold=not every_line)
        read = _events_reader(store, run)
        events = read()
        emit(events)
        if fmt == "text" and run is not None:
            _stack_captures(ctx, run, out)
        if follow:
            _follow(read, emit, clock, interval, len(events))
    finally:
        if out is not None:
            out.close()


def _stack_captures(ctx: click.Context, run: str, out: Any) -> None:
    """The stacks captured before the run's hung jobs were cancelled, listed after its logbook."""
    from supervisor.cli.views.stacks_view import captures_of, listing_lines

    paths = captures_of(Path(context.config(ctx).daemon.state_dir), run)
    if paths:
        click.echo(f"stack captures before a hang's cancel (`slurm-supervisor stacks {run}`):", file=out)
        for line in listing_lines(paths):
            click.echo(f"  {line}", file=out)


def _events_reader(store: Reader, run: str | None) -> Callable[[], list[Event]]:
    """The run's events so far, each call; through the daemon only the new ones are fetched."""
    if not isinstance(store, RemoteStore):
        return lambda: store.events(run)
    seen: list[Event] = []

    def read() -> list[Event]:
        seen.extend(store.events(run, offset=len(seen)))
        return seen

    return read


def _whole_run(fmt: str, record: RunRecord | None, narrowed: bool) -> RunRecord:
    """The run a Markdown or HTML document shows: one, whole (no filters, no following)."""
    if record is None:
        raise click.ClickException(
            f"--format {fmt} shows one run: name it, e.g. `slurm-supervisor logbook "
            f"llama-70b --format {fmt} -o llama-70b.{'md' if fmt == 'markdown' else 'html'}`"
        )
    if narrowed:
        raise click.ClickException(
            "--since, --until, --kind, --node and --follow apply to --format text and "
            f"json; --format {fmt} shows the whole run"
        )
    return record


def _console(out: Any) -> Console:
    from rich.console import Console

    return Console(file=out, soft_wrap=True, highlight=False, markup=False, emoji=False)


def _emitter(
    console: Console, fmt: str, filt: render.EventFilter, evidence: bool, *, fold: bool
) -> Callable[[list[Event]], None]:
    """What prints a batch of events: JSON lines, or text: the first batch (the logbook so far)
    folded unless ``fold`` is off, then (following) one line per event as it comes."""
    batches = 0

    def emit(events: list[Event]) -> None:
        nonlocal batches
        batches += 1
        if fmt == "json":
            for e in events:
                if filt.matches(e):
                    console.out(render.json_line(e), highlight=False)
        elif fold and batches == 1:
            from supervisor.cli.views.logbook_view import folded_texts

            shown = [e for e in events if filt.matches(e)]
            for text in folded_texts(shown, evidence=evidence, incidents=not filt.active):
                console.print(text)
        else:
            render.print_events(console, events, filt, evidence=evidence)

    return emit


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


def _follow(read: Any, emit: Any, clock: SystemClock, interval: float, seen: int) -> None:
    """Follow until Ctrl-C (or SIGTERM): the signal stops the clock's wait, and the command exits 0."""
    handlers = {sig: signal.signal(sig, lambda *_: clock.stop()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        render.follow(read, emit, clock, interval, skip=seen)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def _document(fmt: str, record: RunRecord, store: Reader, now: float) -> str:
    attempts, events = store.attempts(record.name), store.events(record.name)
    series = store.progress(record.name)
    until = _supervised_until(store, attempts, events, series, now) if not record.state.terminal else None
    if fmt == "markdown":
        from supervisor.report.chronicle import render_markdown

        return str(render_markdown(record, attempts, events, now=until, series=series))
    from supervisor.adapters.logbook_html.page import render_html

    return render_html(record, attempts, events, now=until, progress=series)


def _supervised_until(
    store: Reader, attempts: list[AttemptRecord], events: list[Event], series: list[ProgressPoint], now: float
) -> float:
    """Where a live run's account ends: now while the daemon answers (it supervises the run); else
    the store's last record is where supervision stopped, and no time after it is counted (as
    productive or at all)."""
    from supervisor.report.chronicle import last_record

    newest = max([last_record(attempts, events), *(p.at for p in series)])
    return max(now, newest) if isinstance(store, RemoteStore) else newest


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
    from supervisor.domain.goodput.account import goodput, measured_save_s, windows
    from supervisor.report.goodput import gpus_of

    store = context.reader(ctx)
    record = store.get_run(run)
    if record is None:
        raise context.unknown_run(run)
    attempts, events = store.attempts(run), store.events(run)
    series = store.progress(run)
    now = _supervised_until(store, attempts, events, series, wiring.clock().now())
    filt = _event_filter(since, until, (), (), now)
    g = goodput(
        run, attempts, events, now=now, start=filt.since, end=filt.until, series=series, run_nodes=record.spec.nodes
    )
    saves = save_s if save_s is not None else measured_save_s(events, attempts)
    advice = g.advice(saves, saves_on_failure=record.spec.save_on_failure_s > 0)
    parts = windows(run, attempts, events, now=now, width_s=window_h * 3600, series=series) if window_h else []
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
    """Add a note to RUN's logbook, signed with your account (as the kernel names it to the daemon)."""
    if not text.strip():
        raise click.ClickException('the note is empty; write what happened, e.g. "replaced GPU 3 on gpu-117"')
    signer = context.call(ctx, "note", run=run, text=text)
    click.echo(f"note added to the logbook of run {run}, signed {signer}")
