"""The stateful parser: raw lines in order in, progress records out.

Per line it removes colour codes and multi-rank prefixes, splits tqdm's ``\\r`` refreshes,
rejoins terminal-wrapped records and hands the text to the format(s). It holds at most one pending
partial record: the start of a record that did not end where its format ends records (Megatron's
trailing ``|``, a dict's ``}``), plus the continuation lines seen so far. A continuation line has
no rank prefix, does not start a record itself and looks like the format's text (a Megatron
continuation contains a ``|``); it is appended as is (the wrap cut the text, it did not add
anything; keys are matched without spaces so a space lost or kept at the cut does not matter).
Any other line, ``MAX_PARTS`` lines or ``MAX_CHARS`` characters end the pending record, which is
then parsed with what it has. ``flush()`` does the same at the end of the input, or when a live
tail has been quiet for a while (a hung job may stop right after a partial line).

With several formats (auto mode) each line is offered to each format until one reports a record;
from then on only that format is used.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from supervisor.domain.progress.base import UNFINISHED, LineFormat, ScanResult
from supervisor.domain.progress.prefixes import split_prefix, strip_ansi
from supervisor.domain.progress.record import ProgressRecord

MAX_PARTS = 6  # a pending record spans at most this many lines
MAX_CHARS = 16384  # ... and this many characters


class ProgressParser:
    """Feed raw log lines in order; get the records they complete."""

    __slots__ = ("_formats", "_locked", "_pending", "_pending_rank", "_pending_format", "_parts")

    def __init__(self, formats: Sequence[LineFormat]) -> None:
        if not formats:
            raise ValueError("ProgressParser needs at least one format")
        self._formats: tuple[LineFormat, ...] = tuple(formats)
        self._locked: LineFormat | None = formats[0] if len(formats) == 1 else None
        self._pending: str | None = None
        self._pending_rank: int | None = None
        self._pending_format: LineFormat | None = None
        self._parts = 0

    @property
    def format(self) -> str | None:
        """The format in use: the one given, or the one auto mode settled on (``None`` until then)."""
        return self._locked.name if self._locked is not None else None

    @property
    def pending(self) -> bool:
        """Whether a partial (wrapped) record is waiting for its continuation."""
        return self._pending is not None

    def feed(self, line: str) -> list[ProgressRecord]:
        """The records completed by this line (usually zero or one). Never raises."""
        out: list[ProgressRecord] = []
        line = line.rstrip("\n")
        if "\r" in line:
            for part in line.split("\r"):
                if part:
                    self._line(part, out)
        else:
            self._line(line, out)
        return out

    def feed_all(self, lines: Iterable[str]) -> list[ProgressRecord]:
        out: list[ProgressRecord] = []
        for line in lines:
            out.extend(self.feed(line))
        return out

    def flush(self) -> list[ProgressRecord]:
        """Parse the pending partial record, if any, with what it has."""
        out: list[ProgressRecord] = []
        self._finish(out)
        return out

    # ------------------------------------------------------------------------ internals

    def _line(self, text: str, out: list[ProgressRecord]) -> None:
        if "\x1b" in text:
            text = strip_ansi(text)
        rank, body = split_prefix(text)
        if self._pending is not None:
            if rank is None and self._continues(body):
                self._extend(body, out)
                return
            self._finish(out)
        locked = self._locked
        if locked is not None:  # the common case: one format
            self._take(locked, locked.scan(body, rank), body, rank, out)
            return
        for fmt in self._formats:
            if self._take(fmt, fmt.scan(body, rank), body, rank, out):
                return

    def _take(
        self, fmt: LineFormat, result: ScanResult, body: str, rank: int | None, out: list[ProgressRecord]
    ) -> bool:
        """Act on one format's answer for a line; whether the line was taken."""
        if result is None:
            return False
        if result is UNFINISHED:
            self._pending, self._pending_rank, self._pending_format = body, rank, fmt
            self._parts = 1
            return True
        if isinstance(result, ProgressRecord):
            self._locked = fmt
            out.append(result)
            return True
        return False

    def _continues(self, body: str) -> bool:
        fmt = self._pending_format
        if fmt is None or not body.strip():
            return False
        return fmt.continues(body) and not fmt.starts_record(body)

    def _extend(self, body: str, out: list[ProgressRecord]) -> None:
        fmt = self._pending_format
        assert fmt is not None and self._pending is not None
        joined = self._pending + body
        self._parts += 1
        full = self._parts >= MAX_PARTS or len(joined) >= MAX_CHARS
        result = fmt.finish(joined, self._pending_rank, complete=full)
        if result is UNFINISHED:
            self._pending = joined
            return
        self._clear()
        if isinstance(result, ProgressRecord):
            self._locked = fmt
            out.append(result)

    def _finish(self, out: list[ProgressRecord]) -> None:
        fmt, pending, rank = self._pending_format, self._pending, self._pending_rank
        self._clear()
        if fmt is None or pending is None:
            return
        result = fmt.finish(pending, rank, complete=True)
        if isinstance(result, ProgressRecord):
            self._locked = fmt
            out.append(result)

    def _clear(self) -> None:
        self._pending = None
        self._pending_rank = None
        self._pending_format = None
        self._parts = 0
