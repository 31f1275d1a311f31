"""The interface each log format implements, used by the stateful parser (``stream.py``).

A format looks at one line at a time, after rank prefixes and colour codes are gone. ``scan``
answers with a record, with ``UNFINISHED`` when the line starts a record that the terminal wrapped
onto following lines, or with ``None``. Formats may keep a little state (the Hugging Face format
remembers the training progress bar's step); one instance serves one stream.
"""

from __future__ import annotations

from typing import Final

from supervisor.domain.progress.record import ProgressRecord


class _Unfinished:
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNFINISHED"


UNFINISHED: Final = _Unfinished()

ScanResult = ProgressRecord | _Unfinished | None


class LineFormat:
    """Base class: a format that never wraps. Subclasses set ``name`` and implement ``scan``."""

    name: str = ""

    def scan(self, text: str, rank: int | None) -> ScanResult:
        """The record this line reports, ``UNFINISHED``, or ``None``. Never raises."""
        raise NotImplementedError

    def starts_record(self, text: str) -> bool:
        """Whether ``text`` begins a record of this format (so it cannot continue a wrapped one)."""
        return False

    def continues(self, text: str) -> bool:
        """Whether ``text`` may be the rest of a wrapped record of this format."""
        return False

    def finish(self, joined: str, rank: int | None, *, complete: bool) -> ScanResult:
        """Parse a reassembled wrapped record. With ``complete=False`` the text may still be
        unfinished (answer ``UNFINISHED`` to wait for more); with ``complete=True`` no more text
        will come: parse what is there."""
        return None
