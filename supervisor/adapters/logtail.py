"""Follow a job's output file the way ``tail -F`` does and hand out complete lines.

The caller polls: each ``read_lines()`` reads what was appended since the last call (at most
``max_bytes``), splits it into lines and keeps a trailing partial line buffered until its line
break arrives. No threads, no sleeps.

What it survives, and how:

- *The file does not exist yet* (the job is pending): ``[]``; it is opened once it appears.
- *Truncation* (a requeue without ``--open-mode=append`` truncates the output file): when the
  open file is shorter than the offset read so far, reading starts again at 0.
- *Rotation or replacement* (the path now names another file: other device or inode): the old
  file is read to its end first, then the new one from 0.
- *The path removed*: the old file is read to its end and closed; a file that appears later at the
  path is read from 0.
- *Appends across requeues* (``--open-mode=append``): nothing special, reading continues.
- *Invalid UTF-8*: decoded with ``errors="replace"`` (lines are split on bytes first, so a
  multi-byte character is never cut by a read boundary).
- *Line breaks*: ``\\n``, ``\\r\\n`` and a lone ``\\r`` (tqdm's in-place refreshes) each end a
  line. An empty line ended by a lone ``\\r`` is dropped (tqdm starts each refresh with ``\\r``;
  a blank line would end a wrapped record the progress parser is still joining).
- *Huge lines*: a line longer than ``max_line_bytes`` is cut there: its first ``max_line_bytes``
  are handed out as a line, the rest up to the next line break is skipped, and ``cut_lines``
  counts it. Memory stays bounded by ``max_line_bytes`` plus one read.

A partial last line is handed out as a line of its own when its file ends for good (truncated,
replaced or removed): the job wrote it, and no newline will ever complete it.

Like ``tail -F``, a truncation followed by writes past the old offset between two polls is
indistinguishable from an append; keep polls frequent relative to how fast a job writes.

``position`` (device, inode, offset) can be stored and passed back to a new ``LogTail`` to resume
after a daemon restart: the offset is honoured only when the file at the path is still the same
file and not shorter than the offset.

The path comes from a run (its spec, or what Slurm reports for its job) and is read as the
daemon's user, so it is opened the way ``run_files.open_run_file`` opens a run's files: a link, a
FIFO, a device, or a file in the daemon's own folders (``protected``) is refused with
``RunFileRefused`` (an ``OSError``), and nothing blocks.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from supervisor.adapters.run_files import open_run_file

DEFAULT_MAX_BYTES = 4 * 1024 * 1024  # read per call
DEFAULT_MAX_LINE_BYTES = 1024 * 1024  # longest line kept whole
_CHUNK = 256 * 1024
_MAX_SWITCHES = 4  # files followed per call when the path keeps being replaced
_MISSING = (errno.ENOENT, errno.ENOTDIR)


@dataclass(frozen=True)
class TailPosition:
    """Where the tail stands: the file (device, inode) and the byte offset read up to."""

    dev: int
    inode: int
    offset: int


class LogTail:
    """Follow one output file by name; see the module docstring."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        position: TailPosition | None = None,
        start_at_end: bool = False,
        protected: Sequence[str] | None = None,
    ) -> None:
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be at least 1")
        self.path = Path(path)
        self.max_line_bytes = max_line_bytes
        self._fd: int | None = None
        self._dev = 0
        self._inode = 0
        self._offset = 0
        self._partial = bytearray()
        self._skipping = False  # inside the rest of a cut line
        self._after_cr = False  # the last byte seen ended a line with \r: a \n next belongs to it
        self._resume = position
        self._start_at_end = start_at_end
        self._protected = protected  # the daemon's folders (None: run_files.daemon_dirs())
        self.cut_lines = 0  # lines longer than max_line_bytes, cut
        self.truncations = 0  # times the file was found shorter than the offset
        self.reopenings = 0  # times the path was found to name another file (rotation)

    # ------------------------------------------------------------------------ public

    @property
    def position(self) -> TailPosition | None:
        """The open file and the offset read up to; ``None`` while no file is open."""
        if self._fd is None:
            return None
        return TailPosition(self._dev, self._inode, self._offset)

    @property
    def pending_bytes(self) -> int:
        """Bytes of a partial last line waiting for its line break."""
        return len(self._partial)

    def read_lines(self, max_bytes: int = DEFAULT_MAX_BYTES) -> list[str]:
        """Complete lines appended since the last call, without their line breaks; reads at most
        ``max_bytes`` bytes (the rest waits for the next call). ``[]`` when the file does not
        exist. Errors other than a missing file (permissions, I/O) are raised as ``OSError``."""
        if max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        out: list[str] = []
        budget = max_bytes
        if self._fd is None and not self._open():
            return out
        for _ in range(_MAX_SWITCHES + 1):
            budget -= self._read(budget, out)
            # At the end of the open file: does the path still name it?
            if budget <= 0 or not self._switch_if_replaced(out):
                break
        return out

    def finish(self) -> list[str]:
        """The file ends for good (a finished log read offline to its end): its partial last line,
        as a line (``[]`` when there is none)."""
        out: list[str] = []
        self._end_of_file(out)
        return out

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> LogTail:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------------ files

    def _open(self) -> bool:
        """Open the file at the path; whether one is open now."""
        try:
            fd = open_run_file(self.path, self._protected)
        except OSError as exc:
            if exc.errno in _MISSING:
                return False
            raise
        st = os.fstat(fd)
        self._fd, self._dev, self._inode, self._offset = fd, st.st_dev, st.st_ino, 0
        resume, self._resume = self._resume, None
        if resume is not None:
            if (resume.dev, resume.inode) == (st.st_dev, st.st_ino) and 0 <= resume.offset <= st.st_size:
                self._offset = resume.offset
        elif self._start_at_end:
            self._offset = st.st_size
        self._start_at_end = False
        return True

    def _read(self, budget: int, out: list[str]) -> int:
        """Read up to ``budget`` bytes from the open file into lines; the bytes read."""
        fd = self._fd
        assert fd is not None
        size = os.fstat(fd).st_size
        if size < self._offset:
            self.truncations += 1
            self._end_of_file(out)
            self._offset = 0
        done = 0
        while done < budget:
            data = os.pread(fd, min(_CHUNK, budget - done), self._offset)
            if not data:
                break
            self._offset += len(data)
            done += len(data)
            self._feed(data, out)
        return done

    def _switch_if_replaced(self, out: list[str]) -> bool:
        """At the end of the open file: when the path names another file (or none), finish this
        one and open the other. Whether there is a new file to read."""
        try:
            st = os.stat(self.path)
        except OSError as exc:
            if exc.errno not in _MISSING:
                raise
            self._end_of_file(out)
            self.close()
            return False
        if (st.st_dev, st.st_ino) == (self._dev, self._inode):
            return False
        self.reopenings += 1
        self._end_of_file(out)
        self.close()
        return self._open()

    # ------------------------------------------------------------------------ lines

    def _end_of_file(self, out: list[str]) -> None:
        """The data of the current file ends for good: a partial line is a line."""
        if self._partial and not self._skipping:
            out.append(self._partial.decode("utf-8", errors="replace"))
        self._partial.clear()
        self._skipping = False
        self._after_cr = False

    def _feed(self, data: bytes, out: list[str]) -> None:
        start = 0
        n = len(data)
        if self._after_cr and n and data[0] == 0x0A:  # the \n of a \r\n split across reads
            start = 1
        self._after_cr = False
        while start < n:
            nl = data.find(b"\n", start)
            cr = data.find(b"\r", start)
            if nl < 0 and cr < 0:
                self._keep(data[start:], out)
                return
            end = nl if cr < 0 or (0 <= nl < cr) else cr
            self._line(data[start:end], out, by_cr=end == cr)
            start = end + 1
            if end == cr:
                if start < n and data[start] == 0x0A:
                    start += 1
                elif start == n:
                    self._after_cr = True

    def _keep(self, piece: bytes, out: list[str]) -> None:
        """Buffer the start of a line whose break has not arrived, up to ``max_line_bytes``."""
        if self._skipping:
            return
        room = self.max_line_bytes - len(self._partial)
        if len(piece) <= room:
            self._partial += piece
            return
        self._partial += piece[:room]
        self._cut(out)

    def _line(self, piece: bytes, out: list[str], *, by_cr: bool) -> None:
        if self._skipping:
            self._skipping = False
            return
        if len(self._partial) + len(piece) > self.max_line_bytes:
            self._keep(piece, out)
            self._skipping = False  # the line ends here: nothing left to skip
            return
        if self._partial:
            self._partial += piece
            line = bytes(self._partial)
            self._partial.clear()
        else:
            line = piece
        if line or not by_cr:
            out.append(line.decode("utf-8", errors="replace"))

    def _cut(self, out: list[str]) -> None:
        out.append(self._partial.decode("utf-8", errors="replace"))
        self._partial.clear()
        self._skipping = True
        self.cut_lines += 1
