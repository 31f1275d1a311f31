"""`slurm-supervisor ckpt`: commit a finished checkpoint, list checkpoints, verify them.

ROOT is a run's checkpoint root: a directory (Lustre, GPFS, NFS, local) or ``s3://BUCKET/PREFIX``.
S3 credentials come from boto3's usual chain (environment, ~/.aws, instance role); never from
the command line.

Exit status (scripts and job epilogs can rely on it):

=====  ==========================================================================================
 0     done: committed / listed / every checkpoint verified
 1     ``verify``: a checkpoint is corrupt; ``commit``: the checkpoint was already committed
 2     ``verify``: none corrupt, but one could not be verified (storage errors, timeouts);
       ``list`` / ``commit``: the storage did not answer
 3     ``verify``: no checkpoint to verify under ROOT
 64    bad input: unknown scheme, root not found, missing NAME, a step that is not an integer...
=====  ==========================================================================================
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
from typing import Any, NoReturn

import click

from supervisor.adapters.checkpoints.backend import ObjectBackend, StorageError
from supervisor.domain.checkpoints.manifest import CheckpointRef, ChecksumAlgorithm, Level, Outcome, VerifyResult
from supervisor.ports import PortError

EX_USAGE = 64  # sysexits.h: the command was used incorrectly
EXIT_OUTCOME = {Outcome.VERIFIED: 0, Outcome.CORRUPT: 1, Outcome.UNVERIFIABLE: 2}
EXIT_STORAGE = 2
EXIT_NOTHING = 3


class BadInput(click.ClickException):
    exit_code = EX_USAGE


class _Usage(click.UsageError):
    exit_code = EX_USAGE


class _Command(click.Command):
    """Usage errors (a step that is not an integer, a missing argument) exit with 64, not click's 2,
    which ``verify`` uses for "unverifiable"."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise _Usage(exc.format_message(), exc.ctx) from None


def _fail(code: int, message: str) -> NoReturn:
    click.echo(f"Error: {message}", err=True)
    raise SystemExit(code)


# --------------------------------------------------------------------------- roots


def _root(root: str, endpoint_url: str | None) -> tuple[str, bool]:
    """(the root as the backends take it, is_s3); BadInput naming the fix."""
    scheme, sep, rest = root.partition("://")
    if sep and scheme == "s3":
        return root, True
    if endpoint_url:
        raise BadInput("--endpoint-url applies to s3:// roots only")
    if sep and scheme == "file":
        root = rest
    elif sep:
        raise BadInput(f"unknown scheme {scheme}:// in {root!r}: give a directory path or s3://BUCKET/PREFIX")
    if not os.path.isdir(root):
        what = "is not a directory" if os.path.exists(root) else "not found"
        raise BadInput(f"checkpoint root {root} {what}: give the directory the run saves its checkpoints in")
    return root, False


def _backend(root: str, endpoint_url: str | None) -> ObjectBackend:
    path, s3 = _root(root, endpoint_url)
    if not s3:
        from supervisor.adapters.checkpoints.posix import PosixBackend

        return PosixBackend(path)
    from supervisor.adapters.checkpoints.s3 import S3Backend

    try:
        return S3Backend(path, endpoint_url=endpoint_url)
    except ValueError as exc:
        raise BadInput(str(exc)) from None


def _store(root: str, endpoint_url: str | None) -> Any:
    path, s3 = _root(root, endpoint_url)
    from supervisor.adapters.checkpoints.store import open_store

    try:
        return open_store(path, endpoint_url=endpoint_url) if s3 else open_store(path)
    except ValueError as exc:
        raise BadInput(str(exc)) from None


def _discover(store: Any) -> list[CheckpointRef]:
    try:
        refs: list[CheckpointRef] = store.discover()
    except (PortError, StorageError) as exc:  # the port's Transient/PermanentError, a backend's StorageError
        _fail(EXIT_STORAGE, f"cannot list {store.root}: {exc}")
    return refs


# --------------------------------------------------------------------------- commands


@click.group("ckpt")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="warning",
    show_default=True,
    help="Log events (on stderr; results go to stdout).",
)
def ckpt(log_level: str) -> None:
    """Checkpoints: commit a finished one, list them, verify them (docs/checkpoint-layouts.md)."""
    from supervisor.adapters.logging import configure_logging

    configure_logging(log_level, "auto")


@ckpt.command("commit", cls=_Command)
@click.argument("root")
@click.argument("name")
@click.option("--step", type=click.IntRange(min=0), required=True, help="The training step the checkpoint holds.")
@click.option(
    "--algorithm",
    type=click.Choice([a.value for a in ChecksumAlgorithm]),
    default="crc64nvme",
    show_default=True,
    help="Checksum recorded for every shard.",
)
@click.option("--writer", default=None, help="Who wrote it, for the logbook. Default: this host's name.")
@click.option("--run", "run_name", default=None, help="The run's name, recorded in the manifest.")
@click.option(
    "--workers", type=click.IntRange(1, 256), default=8, show_default=True, help="Shards checksummed in parallel."
)
@click.option("--endpoint-url", default=None, help="S3-compatible endpoint (Ceph, MinIO...) for s3:// roots.")
def commit(
    root: str,
    name: str,
    step: int,
    algorithm: str,
    writer: str | None,
    run_name: str | None,
    workers: int,
    endpoint_url: str | None,
) -> None:
    """Write NAME's manifest (ssv-manifest.json) as its commit marker, once every shard is written.

    Run it once per checkpoint, after all ranks have finished saving (after a barrier), e.g.
    ``slurm-supervisor ckpt commit /lustre/proj/run42/ckpt step_000100 --step 100``."""
    from supervisor.adapters.checkpoints.commit import AlreadyCommitted, build_manifest, commit_checkpoint

    backend = _backend(root, endpoint_url)
    try:
        manifest = build_manifest(
            backend,
            name,
            step,
            algorithm=ChecksumAlgorithm(algorithm),
            writer=writer or socket.gethostname(),
            workers=workers,
            run=run_name,
        )
        location = commit_checkpoint(backend, name, manifest)
    except AlreadyCommitted as exc:
        _fail(1, str(exc))
    except StorageError as exc:
        _fail(EXIT_STORAGE, f"{exc} ({'try again' if exc.transient else 'fix the storage first'})")
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    n = len(manifest.shards)
    click.echo(
        f"committed step {step}: {n} shard{'s' if n != 1 else ''}, {_size(manifest.total_bytes)}, "
        f"{manifest.algorithm.value} -> {location}"
    )


@ckpt.command("list", cls=_Command)
@click.argument("root")
@click.option("--endpoint-url", default=None, help="S3-compatible endpoint for s3:// roots.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
def list_(root: str, endpoint_url: str | None, as_json: bool) -> None:
    """Checkpoints found under ROOT (any layout), oldest step first: guarantee, committed or not."""
    refs = _discover(_store(root, endpoint_url))
    if as_json:
        click.echo(json.dumps({"root": root, "checkpoints": [_ref_json(r) for r in refs]}, indent=1))
        return
    if not refs:
        click.echo(f"no checkpoints under {root}")
        return
    rows = [("STEP", "STATE", "GUARANTEE", "NEWEST OBJECT (UTC)", "LOCATION")]
    rows += [
        (
            "-" if r.step is None else str(r.step),
            "committed" if r.committed else "UNCOMMITTED",
            r.guarantee.value,
            _when(r.seen_at),
            r.location,
        )
        for r in refs
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[4])
    weak = sorted({r.guarantee for r in refs if r.guarantee.weak})
    for g in weak:
        click.echo(f"note: {g.value} = {g.describe}")


@ckpt.command("verify", cls=_Command)
@click.argument("root")
@click.argument("name", required=False)
@click.option(
    "--level",
    type=click.Choice([lv.value for lv in Level]),
    default=Level.METADATA.value,
    show_default=True,
    help="metadata: list + HEAD against the manifest; full: read every byte.",
)
@click.option("--endpoint-url", default=None, help="S3-compatible endpoint for s3:// roots.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of lines of text.")
def verify(root: str, name: str | None, level: str, endpoint_url: str | None, as_json: bool) -> None:
    """Verify NAME (or every committed checkpoint under ROOT). Exit 0 verified, 1 corrupt,
    2 unverifiable (storage trouble: never called corrupt), 3 nothing to verify, 64 bad input."""
    store = _store(root, endpoint_url)
    refs = _discover(store)
    targets = _pick(refs, name) if name else [r for r in refs if r.committed]
    skipped = [] if name else [r for r in refs if not r.committed]
    results = [_verify(store, ref, Level(level)) for ref in targets]
    code = max((EXIT_OUTCOME[r.outcome] for r in results), default=EXIT_NOTHING)
    if as_json:
        doc = {
            "root": root,
            "level": level,
            "exit": code,
            "results": [r.evidence() for r in results],
            "skipped_uncommitted": [_ref_json(r) for r in skipped],
        }
        click.echo(json.dumps(doc, indent=1))
    else:
        for r in results:
            step = "-" if r.step is None else r.step
            weak = "" if not r.guarantee.weak else f" [{r.guarantee.value}: weaker guarantee]"
            click.echo(f"{r.outcome.value.upper():12} step {step}  {r.location}{weak}\n    {r.reason}")
            for p in r.problems[:10]:
                click.echo(f"    {p.key}: {p.problem}: {p.detail}")
        for ref in skipped:
            click.echo(f"{'SKIPPED':12} step {ref.step}  {ref.location}\n    uncommitted (torn or being written)")
        if not results:
            click.echo(f"no committed checkpoint to verify under {root}")
    raise SystemExit(code)


def _pick(refs: list[CheckpointRef], name: str) -> list[CheckpointRef]:
    want = name.strip("/")
    hits = [r for r in refs if r.name == want or r.location.rstrip("/").endswith("/" + want)]
    if not hits:
        known = ", ".join(r.name for r in refs[-10:]) or "none"
        raise BadInput(
            f"no checkpoint named {name!r} under the root (newest found: {known}); "
            "`slurm-supervisor ckpt list ROOT` shows them all"
        )
    return hits


def _verify(store: Any, ref: CheckpointRef, level: Level) -> VerifyResult:
    result: VerifyResult = store.verify(ref, level)  # never raises for storage trouble (the port's contract)
    return result


def _ref_json(r: CheckpointRef) -> dict[str, Any]:
    return {
        "location": r.location,
        "name": r.name,
        "step": r.step,
        "guarantee": r.guarantee.value,
        "weak": r.guarantee.weak,
        "committed": r.committed,
        "seen_at": r.seen_at,
    }


def _when(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"
