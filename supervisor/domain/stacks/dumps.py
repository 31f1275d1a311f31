"""One rank's Python stacks as the node agent reports them (py-spy ``dump --json``), made values.

What arrives was read from a job's processes by a program on a node: untrusted. Every string is
made one printable line and cut (``printable``) here, every list is cut to its bound, so each view
(terminal, Markdown, HTML, the logbook's evidence) starts from bounded text without control
characters; the Markdown and HTML views escape again for their own syntax.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from supervisor.domain.text_safety import printable

MAX_THREADS = 16  # per process: the main thread and the first others
MAX_FRAMES = 48  # per thread, innermost first (where it waits is at the top)
MAX_NAME = 160  # characters of a function name
MAX_FILE = 200  # characters of a file name (its end is kept: the module path)
MAX_ERROR = 300
MAX_RANK = 1 << 20


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int

    def text(self) -> str:
        return f"{self.function} ({self.file}:{self.line})"


@dataclass(frozen=True)
class Thread:
    name: str
    main: bool  # the process's main thread (its thread id is the pid)
    frames: tuple[Frame, ...]  # innermost first


@dataclass(frozen=True)
class RankDump:
    """One training process's stacks (``error``: why there are none)."""

    node: str
    rank: int
    pid: int
    threads: tuple[Thread, ...] = ()
    error: str | None = None
    moved: bool | None = None  # its main stack changed between two samples (None: one sample only)

    @property
    def main_frames(self) -> tuple[Frame, ...]:
        """The main thread's frames (the first thread's when none is marked main)."""
        main = next((t for t in self.threads if t.main), self.threads[0] if self.threads else None)
        return main.frames if main is not None else ()

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "rank": self.rank,
            "pid": self.pid,
            "error": self.error,
            "moved": self.moved,
            "threads": [
                {"name": t.name, "main": t.main, "frames": [[f.function, f.file, f.line] for f in t.frames]}
                for t in self.threads
            ],
        }


def _text(value: object, limit: int, keep_end: bool = False) -> str:
    raw = str(value) if value is not None else ""
    raw = raw[-limit - 1 :] if keep_end else raw[: limit + 1]  # cut first: escaping keeps the length
    text = printable(raw)
    if len(text) <= limit:
        return text
    return "…" + text[-(limit - 1) :] if keep_end else text[: limit - 1] + "…"


def _int(value: object, low: int, high: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return None
    return value


def frame_of(raw: object) -> Frame | None:
    """A frame from py-spy's object (``name``, ``filename``, ``line``) or a stored triple."""
    if isinstance(raw, Mapping):
        name, file, line = raw.get("name"), raw.get("filename"), raw.get("line")
    elif isinstance(raw, list | tuple) and len(raw) == 3:
        name, file, line = raw
    else:
        return None
    number = _int(line, 0, 1 << 31)
    return Frame(_text(name, MAX_NAME), _text(file, MAX_FILE, keep_end=True), number or 0)


def thread_of(raw: object, pid: int) -> Thread | None:
    """A thread from py-spy's object (``thread_name``, ``os_thread_id``, ``frames``) or a stored one."""
    if not isinstance(raw, Mapping):
        return None
    frames = raw.get("frames")
    frames = frames[:MAX_FRAMES] if isinstance(frames, list) else []
    parsed = tuple(f for f in (frame_of(x) for x in frames) if f is not None)
    main = raw.get("main") is True or (raw.get("os_thread_id") == pid and pid > 0)
    return Thread(_text(raw.get("thread_name", raw.get("name")), MAX_NAME), main, parsed)


def rank_dump(raw: Mapping[str, Any], node: str) -> RankDump | None:
    """One process's line from a node's agent (``rank``, ``pid``, ``threads`` or ``error``), on
    ``node`` (the node the capture step ran on, not what the line claims); None: not one."""
    rank, pid = _int(raw.get("rank"), 0, MAX_RANK), _int(raw.get("pid"), 1, 1 << 31)
    if rank is None or pid is None:
        return None
    error = raw.get("error")
    threads = raw.get("threads")
    threads = threads[:MAX_THREADS] if isinstance(threads, list) else []
    parsed = tuple(t for t in (thread_of(x, pid) for x in threads) if t is not None)
    moved = raw.get("moved")
    moved = moved if isinstance(moved, bool) else None
    return RankDump(node, rank, pid, parsed, _text(error, MAX_ERROR) if error else None, moved)


def rank_dump_from_json(raw: Mapping[str, Any]) -> RankDump | None:
    """A dump stored by ``RankDump.to_json`` (a capture file read back: as untrusted as new)."""
    return rank_dump(raw, _text(raw.get("node"), MAX_NAME))


@dataclass(frozen=True)
class Capture:
    """What one capture over a job's nodes brought: the ranks' dumps, the nodes that gave none
    (node -> why: py-spy missing, ptrace refused, no answer before the deadline), how long it took."""

    dumps: tuple[RankDump, ...]
    missing: Mapping[str, str]
    took_s: float
    error: str | None = None  # the capture as a whole failed (srun refused, not found)
    dropped: int = 0  # lines not read: too long, not JSON, not from a node of the job

    def to_json(self) -> dict[str, Any]:
        return {
            "took_s": round(self.took_s, 3),
            "error": self.error,
            "dropped": self.dropped,
            "missing": dict(self.missing),
            "dumps": [d.to_json() for d in self.dumps],
        }
