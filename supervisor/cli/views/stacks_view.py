"""What `slurm-supervisor stacks` and `analyze FOLDER` print of a hang's stack captures
(docs/hang-stacks.md): the files read back as untrusted (every dump bounded and made printable again
on the way in, ``rank_dump_from_json``), judged again, every line printed through ``printable``."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import click

from supervisor.domain.stacks.dumps import RankDump, rank_dump_from_json
from supervisor.domain.stacks.places import placement
from supervisor.domain.stacks.verdict import judge
from supervisor.domain.text_safety import printable

MAX_FILE = 64 << 20  # a capture file read at most this large (the daemon writes at most [stacks] max_file_bytes)


def captures_of(state_dir: Path, run: str) -> list[Path]:
    from supervisor.adapters.stack_files import StackFiles

    return StackFiles(state_dir / "stacks").listed(run)


def read_capture(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        raw = f.read(MAX_FILE + 1)
    if len(raw) > MAX_FILE:
        raise click.ClickException(f"{printable(str(path))}: larger than {MAX_FILE} bytes; not a capture file")
    try:
        doc = json.loads(raw)
    except ValueError:
        raise click.ClickException(f"{printable(str(path))}: not a capture file (not JSON)") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("dumps"), list):
        raise click.ClickException(f"{printable(str(path))}: not a capture file (no dumps)")
    return doc


def dumps_of(doc: Mapping[str, Any]) -> list[RankDump]:
    return [d for d in (rank_dump_from_json(x) for x in doc["dumps"] if isinstance(x, dict)) if d is not None]


def capture_lines(doc: Mapping[str, Any], *, ranks: bool = False) -> list[str]:
    """One capture, judged again from its dumps: the verdict, the groups, (each rank's stack)."""
    dumps = dumps_of(doc)
    raw = doc.get("missing")
    missing: dict[str, Any] = raw if isinstance(raw, dict) else {}
    nodes = sorted({d.node for d in dumps} | set(missing))
    verdict = judge(dumps, nodes, {str(k): str(v) for k, v in missing.items()})
    took = doc.get("took_s")
    lines = [f"verdict: {verdict.summary}"]
    lines += [f"captured in {took} s" if isinstance(took, int | float) else "captured in ? s"]
    lines += [f"no stacks from {n}: {w}" for n, w in sorted(missing.items())[:64]]
    for g in verdict.groups:
        who = ", ".join(str(r) for r in g.ranks[:16]) + (f" and {len(g.ranks) - 16} more" if len(g.ranks) > 16 else "")
        lines.append(f"{g.place.value} ({g.what}): {len(g.ranks)} rank(s) [{who}] on {', '.join(g.nodes[:16])}")
        lines += [f"    {frame}" for frame in g.stack]
    if ranks:
        for d in dumps:
            lines.append(f"rank {d.rank} ({d.node}, pid {d.pid}): {placement(d).place.value}" + (f": {d.error}" if d.error else ""))  # fmt: skip
            lines += [f"    {f.text()}" for f in d.main_frames]
    return [printable(line, 2000) for line in lines]


def listing_lines(paths: Iterable[Path]) -> list[str]:
    out = []
    for path in paths:
        try:
            summary = read_capture(path).get("verdict", {}).get("summary", "?")
        except (OSError, click.ClickException):
            summary = "(unreadable)"
        out.append(printable(f"{path.stem}  {summary}", 400))
    return out


def print_folder(folder: Path) -> None:
    """Every capture in ``folder``, newest first, judged again (``analyze FOLDER``)."""
    paths = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    if not paths:
        raise click.ClickException(f"no stack captures (*.json) in {printable(str(folder), 200)}")
    for path in paths[:100]:
        click.echo(f"{printable(path.stem, 200)}:")
        for line in capture_lines(read_capture(path)):
            click.echo(f"  {line}")
