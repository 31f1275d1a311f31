"""The guard's audit log: one JSON object per line, appended (``O_APPEND``: each line is one
``write``, so lines of concurrent writers never interleave), synced before the answer is sent.
Nothing in the guard reads it back: it is for people (docs/guard.md lists its fields)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from supervisor.guard.policy import Caller, Request, Verdict


class AuditLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def close(self) -> None:
        os.close(self._fd)

    def write(self, entry: Mapping[str, Any]) -> None:
        line = json.dumps(entry, sort_keys=True, ensure_ascii=True) + "\n"
        os.write(self._fd, line.encode("ascii"))
        os.fsync(self._fd)


def entry(caller: Caller, req: Request, verdict: Verdict, at: float, done: str = "") -> dict[str, Any]:
    """One audit line: who (the kernel's word), what they asked, what the guard decided and why.
    ``run`` and ``cause`` are kept as sent (JSON-escaped), truncated: what was claimed."""
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)),
        "at": round(at, 3),
        "uid": caller.uid,
        "user": caller.name,
        "pid": caller.pid,
        "op": req.op[:20],
        "node": req.node[:80],
        "job": verdict.job,
        "run": req.run[:80],
        "cause": req.cause[:300],
        "granted": verdict.granted,
        "rule": verdict.rule,
        "why": verdict.why,
        "reason": verdict.reason,
        "done": done,
    }
