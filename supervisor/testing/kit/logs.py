"""In-memory job output for tests: the ``LogSource`` and ``LogOpener`` ports without files.

``MemoryLog`` is the stateful fake of ``LogSource`` whose real counterpart is
``supervisor.adapters.logtail.LogTail``; both run the contract in
``tests/contract/test_log_source_contract.py``. A test writes (``write`` for raw text,
``append`` for whole lines); the engine reads what is new, complete lines only::

    logs = MemoryLogs()                         # the LogOpener given to ProgressWatch
    ...                                         # the engine opens /logs/llm-1000.out
    logs["/logs/llm-1000.out"].append(" iteration 1/ 100 | ...")
"""

from __future__ import annotations

import re

_BREAK = re.compile(r"\r\n|\r|\n")


class MemoryLog:
    """A followed output file held in memory: complete lines written since the last read.

    Line breaks are ``\\n``, ``\\r\\n`` and a lone ``\\r``, as ``LogTail`` reads them; a partial
    last line waits for its break. ``closed`` tells whether the engine let go of it."""

    def __init__(self) -> None:
        self._pending = ""
        self._after_cr = False  # the last write ended with \r: a \n first in the next belongs to it
        self._ready: list[str] = []
        self.closed = False

    def write(self, text: str) -> None:
        """Append raw text, as a job writes its output (lines may arrive in pieces)."""
        if self._after_cr and text.startswith("\n"):
            text = text[1:]
        self._after_cr = text.endswith("\r") if text else self._after_cr
        data, start, lines = self._pending + text, 0, []
        for brk in _BREAK.finditer(data):
            line, start = data[start : brk.start()], brk.end()
            if line or brk.group() != "\r":  # a lone \r starting a progress-bar refresh is no line
                lines.append(line)
        self._pending = data[start:]
        self._ready += lines

    def append(self, *lines: str) -> None:
        """Append whole lines."""
        self.write("".join(line + "\n" for line in lines))

    # -- the LogSource port ---------------------------------------------------------------------

    def read_lines(self) -> list[str]:
        out, self._ready = self._ready, []
        return out

    def close(self) -> None:
        self.closed = True


class MemoryLogs:
    """The ``LogOpener`` port over ``MemoryLog``: each open of a path starts a new, empty file
    (a new job's output); ``logs[path]`` is the newest one opened there."""

    def __init__(self) -> None:
        self.opened: dict[str, MemoryLog] = {}

    def __call__(self, path: str, at_end: bool) -> MemoryLog:
        log = self.opened[path] = MemoryLog()
        return log

    def __getitem__(self, path: str) -> MemoryLog:
        return self.opened[path]

    def __contains__(self, path: object) -> bool:
        return path in self.opened

    def append_all(self, *lines: str) -> None:
        """Append ``lines`` to every file opened so far (a trainer whose output all attempts share)."""
        for log in self.opened.values():
            log.append(*lines)
