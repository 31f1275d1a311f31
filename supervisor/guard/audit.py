"""The guard's audit log: one JSON object per line, appended (``O_APPEND``: each line is one
``write``, so lines of concurrent writers never interleave). Nothing in the guard reads it back:
it is for people (docs/guard.md lists its fields).

Bounded (review 2026-12-02, finding 4: 5 s of malformed lines from one user wrote 3.2 MB):

* a grant is written and synced before the answer, always;
* a refusal is written in full the first time a UID gets that rule, and its repeats within
  ``FOLD_S`` are counted, not written: when the fold closes, one line says how many there were
  (``"repeats"``, ``"first_at"``), with the last one's fields;
* past ``max_bytes`` the file is rotated (``audit.jsonl`` -> ``audit.jsonl.1`` ... ``.{keep}``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from supervisor.guard.policy import Caller, Request, Verdict

log = structlog.get_logger("supervisor.guard")

FOLD_S = 60.0  # repeats of one UID's refusal by one rule within this are one line
MAX_FOLDS = 1024  # folds open at once; the oldest is closed to make room
MAX_BYTES = 64 << 20
KEEP = 4


@dataclass
class _Fold:
    first_at: float
    last: Mapping[str, Any]
    repeats: int = 0


class AuditLog:
    def __init__(self, path: Path, *, max_bytes: int = MAX_BYTES, keep: int = KEEP) -> None:
        self.path, self.max_bytes, self.keep = path, max_bytes, keep
        self._fd = self._open()
        self._folds: dict[tuple[int, str], _Fold] = {}
        self._lock = threading.Lock()  # the request threads record, the serving thread closes folds
        self._rotation_failed = False

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def close(self) -> None:
        self.flush_due(float("inf"))
        os.close(self._fd)

    def record(self, entry: Mapping[str, Any]) -> None:
        """The guard's one call: a grant is written, a refusal folded with its repeats."""
        with self._lock:
            if entry["granted"]:
                self._write(entry)
                return
            key = (int(entry["uid"]), str(entry["rule"]))
            fold = self._folds.get(key)
            if fold is not None and entry["at"] - fold.first_at <= FOLD_S:
                fold.repeats += 1
                fold.last = entry
                return
            self._close_fold(key)
            self._write(entry)
            self._folds[key] = _Fold(entry["at"], entry)
            if len(self._folds) > MAX_FOLDS:
                self._close_fold(min(self._folds, key=lambda k: self._folds[k].first_at))

    def flush_due(self, now: float) -> None:
        """Close the folds older than FOLD_S (the serving thread calls it between requests)."""
        with self._lock:
            for key in [k for k, f in self._folds.items() if now - f.first_at > FOLD_S]:
                self._close_fold(key)

    def _close_fold(self, key: tuple[int, str]) -> None:
        fold = self._folds.pop(key, None)
        if fold is not None and fold.repeats:
            self._write({**fold.last, "repeats": fold.repeats, "first_at": round(fold.first_at, 3)})

    def _write(self, entry: Mapping[str, Any]) -> None:
        line = json.dumps(entry, sort_keys=True, ensure_ascii=True) + "\n"
        os.write(self._fd, line.encode("ascii"))
        os.fsync(self._fd)
        if os.fstat(self._fd).st_size > self.max_bytes:
            self._rotate()

    def _rotate(self) -> None:
        """audit.jsonl.{keep} is dropped, each other one moves up, and a new file is started. With
        ``chattr +a`` the rename fails: the log then keeps growing, and says so once."""
        try:
            for n in range(self.keep - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{n}")
                if older.exists():
                    older.rename(self.path.with_name(f"{self.path.name}.{n + 1}"))
            self.path.rename(self.path.with_name(f"{self.path.name}.1"))
        except OSError as exc:
            if not self._rotation_failed:
                log.error("guard.audit_rotate_failed", path=str(self.path), error=str(exc))
            self._rotation_failed = True
            return
        os.close(self._fd)
        self._fd = self._open()


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
