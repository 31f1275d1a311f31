"""Hang captures kept under the state directory (``STATE/stacks/RUN/NAME.json``), for people:
``slurm-supervisor stacks RUN`` and the logbook list them; the engine never reads them back.

Bounded: one rank's dump at most ``per_rank_bytes`` (else its other threads are left out, then its
frames cut), one capture at most ``total_bytes`` (ranks beyond it are left out, and counted), the
newest ``keep`` captures of a run (older ones deleted at each new one). Files are the daemon's own
(0600, in a 0700 folder), written whole (a temporary file renamed).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import structlog

from supervisor.domain.stacks.dumps import Capture, RankDump
from supervisor.domain.stacks.verdict import StackVerdict

log = structlog.get_logger(__name__)

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class StackFileLimits:
    per_rank_bytes: int = 64 << 10
    total_bytes: int = 8 << 20
    keep: int = 20


def safe_name(text: str) -> str:
    return _UNSAFE.sub("_", text)[:120] or "_"


def bounded_rank(dump: RankDump, limit: int) -> dict[str, Any]:
    """The dump's JSON within ``limit`` bytes: all threads, else the main one, else fewer frames."""
    whole = dump.to_json()
    if len(json.dumps(whole)) <= limit:
        return whole
    main = tuple(t for t in dump.threads if t.main)[:1] or dump.threads[:1]
    cut = replace(dump, threads=main)
    while len(json.dumps(cut.to_json())) > limit and cut.threads and cut.threads[0].frames:
        thread = cut.threads[0]
        cut = replace(cut, threads=(replace(thread, frames=thread.frames[: len(thread.frames) // 2]),))
    return {**cut.to_json(), "cut": True}


class StackFiles:
    def __init__(self, root: Path, limits: StackFileLimits = StackFileLimits()) -> None:
        self.root, self.limits = root, limits

    def folder(self, run: str) -> Path:
        return self.root / safe_name(run)

    def keep(self, run: str, name: str, capture: Capture, verdict: StackVerdict) -> str | None:
        body = capture_file_text(run, capture, verdict, self.limits)
        folder = self.folder(run)
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            path = folder / f"{safe_name(name)}.json"
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".stacks-")
            with os.fdopen(fd, "w") as f:
                f.write(body)
            os.replace(tmp, path)
            self._prune(folder)
        except OSError as exc:
            log.error("stacks_not_kept", run=run, error=str(exc))
            return None
        return str(path)

    def _prune(self, folder: Path) -> None:
        kept = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in kept[self.limits.keep :]:
            old.unlink(missing_ok=True)

    def listed(self, run: str) -> list[Path]:
        """The run's captures, newest first."""
        folder = self.folder(run)
        if not folder.is_dir():
            return []
        return sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)


def capture_file_text(run: str, capture: Capture, verdict: StackVerdict, limits: StackFileLimits) -> str:
    """A capture file's text, within ``limits``: ranks that no longer fit are left out (counted)."""
    head = {"run": run, **capture.to_json(), "verdict": verdict.evidence(), "dumps": []}
    room = limits.total_bytes - len(json.dumps(head))
    dumps, left_out = [], 0
    for dump in capture.dumps:
        one = bounded_rank(dump, limits.per_rank_bytes)
        size = len(json.dumps(one)) + 2
        if size > room:
            left_out += 1
            continue
        dumps.append(one)
        room -= size
    return json.dumps({**head, "dumps": dumps, "left_out": left_out})
