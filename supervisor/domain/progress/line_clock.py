"""When each line of a finished training log was written, for replaying it offline
(``slurm-supervisor analyze``). Pure: no I/O, no clock.

The daemon reads a live log at the time it polls; a replay must give every line a time of its own.
Two sources, decided once per log from its first lines (``LineClock.start``):

* **log timestamps** — an ISO-like ``YYYY-MM-DD HH:MM:SS`` near the start of a line (Megatron-LM
  2024+ ``[2024-04-06 02:59:36] iteration``, torchtitan and NeMo logger prefixes, fairseq, Python
  logging). A line with one is at that time; a record line without one is after the previous line
  by its own step time × the steps it advanced (a log that timestamps only some lines). Time
  never runs backwards (a timestamp behind the clock changes nothing). Hangs are judged.
* **step times** — no timestamp in the first lines: a record line is after the previous one by its
  step time (seconds per step, else ``DEFAULT_STEP_S``) × the steps it advanced. Times are then
  consistent with the steps by construction: they order events but cannot show a stall, so hangs
  are not judged (``judges_hangs``). Timestamps later in such a log are ignored (switching clocks
  mid-log would open a gap of decades).

Timestamps without a zone are taken as UTC: only the differences between lines matter.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta, timezone
from enum import StrEnum

from supervisor.domain.progress.pauses import ends_pause, pause_of
from supervisor.domain.progress.record import ProgressRecord
from supervisor.domain.progress.stream import ProgressParser

SCAN_CHARS = 200  # a timestamp is looked for this far into a line (prefixes included), no further
DEFAULT_STEP_S = 1.0  # seconds per step when a log prints no step time (HF Trainer)

_STAMP = re.compile(
    r"(?<!\d)(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,6}))?\s?(Z|[+-]\d\d:?\d\d)?(?!\d)"
)
_CKPT_STEP = re.compile(
    r"(?:iteration|global[_ ]step|step|iter)[\s:=_-]*(\d{1,12})|checkpoint[-_](\d{1,12})", re.IGNORECASE
)


class ClockSource(StrEnum):
    TIMESTAMPS = "log timestamps"
    STEP_TIMES = "step times"


def timestamp_of(line: str) -> float | None:
    """Seconds since the epoch of the first ISO-like timestamp in the line's first ``SCAN_CHARS``
    characters; ``None`` when there is none (or it is no real date)."""
    m = _STAMP.search(line, 0, SCAN_CHARS)
    if m is None:
        return None
    year, month, day, hour, minute, second, frac, zone = m.groups()
    try:
        at = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second), tzinfo=_zone(zone))
    except ValueError:
        return None
    return at.timestamp() + (float(f"0.{frac}") if frac else 0.0)


def _zone(text: str | None) -> timezone:
    if not text or text == "Z":
        return UTC
    sign = -1 if text[0] == "-" else 1
    digits = text[1:].replace(":", "")
    return timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))


def first_timestamp(lines: Iterable[str]) -> float | None:
    """The first timestamp in ``lines`` (a log's first lines): where a timestamped replay starts."""
    for line in lines:
        at = timestamp_of(line)
        if at is not None:
            return at
    return None


def checkpoint_step_of(line: str) -> int | None:
    """The step a save line names (``saving checkpoint at iteration 1000``, ``checkpoint-500``,
    ``step=9000``); ``None`` when it names none."""
    m = _CKPT_STEP.search(line)
    if m is None:
        return None
    return int(m.group(1) or m.group(2))


class LineClock:
    """Gives each line of one log, fed in order, its time. It reads the lines with a parser of its
    own (the same format rules as the daemon's watch, so the same records) for step times."""

    def __init__(self, parser: ProgressParser, start: float, source: ClockSource) -> None:
        self.parser = parser
        self.source = source
        self.now = start
        self.last_step: int | None = None
        self.records = 0

    @classmethod
    def start(cls, parser: ProgressParser, head: Iterable[str], origin: float) -> LineClock:
        """A clock for a log whose first lines are ``head``: at its first timestamp when there is
        one, else at ``origin`` on step times."""
        stamp = first_timestamp(head)
        if stamp is None:
            return cls(parser, origin, ClockSource.STEP_TIMES)
        return cls(parser, stamp, ClockSource.TIMESTAMPS)

    @property
    def judges_hangs(self) -> bool:
        return self.source is ClockSource.TIMESTAMPS

    def time_of(self, line: str) -> tuple[float, ProgressRecord | None]:
        """The line's time, and the last record with a step it completed (if any)."""
        stamp = timestamp_of(line) if self.source is ClockSource.TIMESTAMPS else None
        stepped = None
        for record in self.parser.feed(line):
            self.records += 1
            if record.step is not None:
                stepped = record
        if stepped is not None:
            assert stepped.step is not None
            advanced = stepped.step - self.last_step if self.last_step is not None else 0
            if stamp is None and advanced > 0:
                self.now += advanced * (stepped.step_time_s or DEFAULT_STEP_S)
            self.last_step = stepped.step
        if stamp is not None and stamp > self.now:
            self.now = stamp
        return self.now, stepped


class SaveTracker:
    """Checkpoint saves a log announces: when each began and ended, and the step it holds. A save
    ends with its end line, or with the next new step when the format prints none."""

    def __init__(self) -> None:
        self.started: tuple[float, int | None] | None = None
        self.last_step: int | None = None

    def feed(self, line: str, at: float, record: ProgressRecord | None) -> tuple[float, float, int | None] | None:
        """``(began, ended, step)`` of a save this line ends, else ``None``."""
        done = None
        stepped = record is not None and record.step is not None and record.step != self.last_step
        if self.started is not None and (stepped or (_may_save(line) and ends_pause(line))):
            began, step = self.started
            done = (began, at, step)
            self.started = None
        if record is not None and record.step is not None:
            self.last_step = record.step
        if done is None and self.started is None and _may_save(line) and pause_of(line) == "a checkpoint save":
            self.started = (at, checkpoint_step_of(line) or self.last_step)
        return done


def _may_save(line: str) -> bool:
    """Whether the line may announce a save's start or end (every such line names a save or a
    checkpoint): a cheap test before the pause patterns, which cost ~50 µs on a long line."""
    low = line.lower()
    return "sav" in low or "checkpoint" in low
