"""`slurm-supervisor analyze LOG...`: replay finished training logs through the daemon's detectors
and print what it would have done, and when (docs/analyze.md). Wiring only: files are streamed
with the daemon's own reader (``LogTail``), the replay is ``analyze.replay``, its decisions land in a
throw-away store in a temporary folder."""

from __future__ import annotations

import os
import pathlib
import stat
import sys
import tempfile
from collections.abc import Iterator

import click

from supervisor.analyze.replay import AttemptLog, ReplaySettings, replay, trainer_state_lines
from supervisor.cli import context
from supervisor.cli.views.analyze_render import print_report, report_json
from supervisor.config import ConfigError, load_daemon_config, load_run_spec
from supervisor.config.run_file import expand_hostlist
from supervisor.domain.progress import canonical_name
from supervisor.domain.progress.hang import HangSettings
from supervisor.domain.run import SpikePolicy

TRAINER_STATE_MAX_BYTES = 256 * 1024 * 1024  # a trainer_state.json is read whole: at most this big
_SNIFF_BYTES = 64 * 1024


@click.command()
@click.argument("logs", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--json", "as_json", is_flag=True, help="One JSON document (keys in docs/analyze.md).")
@click.option(
    "--format",
    "log_format",
    default=None,
    metavar="NAME",
    help="Read every log as this format (megatron, nemo, torchtitan, hf-trainer, fairseq, ssv-jsonl, "
    "or an alias); default: detected per log, as the daemon does.",
)
@click.option(
    "--spec", "spec_path", type=click.Path(exists=True, dir_okay=False), help="A run spec whose [spikes] to use."
)
@click.option(
    "--nodes", default=None, metavar="HOSTLIST", help="The job's nodes in Slurm's order (gpu-[01-16]), for stragglers."
)
@click.option(
    "--checkpoint-every",
    type=click.IntRange(min=1),
    default=None,
    metavar="STEPS",
    help="Assume a verified checkpoint every STEPS steps (besides the saves the log reports).",
)
@click.option(
    "--poll-interval", type=click.FloatRange(min=0.2, max=600), default=None, help="Seconds between the daemon's polls."
)
@click.option(
    "--limit", type=click.IntRange(min=1, max=100000), default=200, show_default=True, help="Entries shown per kind."
)
@click.pass_context
def analyze(
    ctx: click.Context,
    logs: tuple[str, ...],
    as_json: bool,
    log_format: str | None,
    spec_path: str | None,
    nodes: str | None,
    checkpoint_every: int | None,
    poll_interval: float | None,
    limit: int,
) -> None:
    """Replay training logs (several: consecutive attempts of one run, in order) through the
    supervisor's detectors: spikes and how they end, rollbacks, divergence, stragglers, hangs and
    checkpoint saves, with the step and time each would have been decided at. One folder of
    stack captures (a hang's, docs/hang-stacks.md): each classified again, newest first."""
    if len(logs) == 1 and os.path.isdir(logs[0]):  # a folder of stack captures (docs/hang-stacks.md)
        from supervisor.cli.views.stacks_view import print_folder

        print_folder(pathlib.Path(logs[0]))
        return
    if any(os.path.isdir(p) for p in logs):
        raise click.BadParameter("a folder is read alone, as stack captures; logs are files", param_hint="LOGS")
    from supervisor.adapters.logging import configure_logging

    configure_logging("error", "auto")  # the watch's own log lines (following, rollback_decided) are not the report
    settings = _settings(ctx, log_format, spec_path, nodes, checkpoint_every, poll_interval, limit)
    attempts = [_attempt_log(path, log_format) for path in logs]
    from supervisor.adapters.sqlite import SqliteStore

    with tempfile.TemporaryDirectory(prefix="ssv-analyze-") as folder:
        store = SqliteStore(folder)
        try:
            report = replay(attempts, store, settings)
        finally:
            store.close()
    if as_json:
        click.echo(report_json(report))
    else:
        print_report(report, sys.stdout)


def _settings(
    ctx: click.Context,
    log_format: str | None,
    spec_path: str | None,
    nodes: str | None,
    checkpoint_every: int | None,
    poll_interval: float | None,
    limit: int,
) -> ReplaySettings:
    """The daemon's settings the replay uses: [hang] and the poll interval of the configuration
    named by --config / --instance (else the defaults), [spikes] of --spec (else the defaults)."""
    if log_format is not None:
        try:
            canonical_name(log_format)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--format") from None
    hang, poll = HangSettings(), 5.0
    obj = ctx.ensure_object(dict)
    if obj.get("config_path") or obj.get("instance"):
        try:
            cfg = load_daemon_config(context.config_path(obj))
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from None
        h = cfg.hang
        hang = HangSettings(h.multiple, h.floor_s, h.cap_s, h.startup_grace_s, pause_cap_s=h.pause_cap_s)
        poll = cfg.daemon.poll_interval_s
    spikes = SpikePolicy()
    if spec_path is not None:
        try:
            spikes = load_run_spec(spec_path).spikes
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from None
    try:
        names = tuple(expand_hostlist(nodes)) if nodes else ()
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--nodes") from None
    every = checkpoint_every
    return ReplaySettings(hang, spikes, poll_interval or poll, names, every, limit=limit)


def _attempt_log(path: str, log_format: str | None) -> AttemptLog:
    """One attempt's log: a Hugging Face trainer_state.json read whole (bounded), any other file
    streamed line by line."""
    real = os.path.realpath(path)  # a person's own link to a log is fine here (the daemon refuses links)
    state = _trainer_state(real)
    if state:
        if log_format is not None and canonical_name(log_format) != "hf-trainer":
            raise click.BadParameter(
                f"{path} is a trainer_state.json (hf-trainer), not {log_format}", param_hint="--format"
            )
        return AttemptLog(path, state, "ssv-jsonl", "trainer_state.json", shown_format="hf-trainer")
    return AttemptLog(path, _stream(real), log_format, "forced" if log_format else "detected")


def _trainer_state(path: str) -> list[str]:
    """The records of a trainer_state.json as replay lines; ``[]`` when the file is not one."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise click.ClickException(f"{path}: not a regular file")
        with open(path, "rb") as f:
            head = f.read(_SNIFF_BYTES)
            if not (head.lstrip().startswith(b"{") and b'"log_history"' in head and b'"ssv"' not in head[:4096]):
                return []
            if info.st_size > TRAINER_STATE_MAX_BYTES:
                raise click.ClickException(f"{path}: a trainer_state.json over {TRAINER_STATE_MAX_BYTES >> 20} MiB")
            text = (head + f.read()).decode("utf-8", errors="replace")
    except OSError as exc:
        raise click.ClickException(f"{path}: {exc.strerror or exc}") from None
    return trainer_state_lines(text)


def _stream(path: str) -> Iterator[str]:
    """The file's lines, read as the daemon reads a job's output (LogTail: bounded reads and
    lines, \\r refreshes, invalid UTF-8 replaced), its partial last line included."""
    from supervisor.adapters.logtail import LogTail

    try:
        size = os.stat(path).st_size  # a finished log: read to where it ended when the replay began
        with LogTail(path, protected=()) as tail:
            while True:
                lines = tail.read_lines()
                yield from lines
                where = tail.position
                if not lines and (where is None or where.offset >= size):
                    break  # (a read inside a cut, overlong line hands out no line: not the end)
            yield from tail.finish()
    except OSError as exc:
        raise click.ClickException(f"{path}: {exc}") from None
