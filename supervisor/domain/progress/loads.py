"""Log lines about loading a checkpoint, and what an attempt's log says of its load. Pure.

Checkpoint fallback (``domain/checkpoints/demotion.py``) passes over a checkpoint only on evidence that loading
it failed; this is where the log evidence comes from:

* **the log shows a load error** — PyTorch's ``Error(s) in loading state_dict``,
  ``torch.distributed.checkpoint``'s ``CheckpointException``, ``torch.load``'s
  ``PytorchStreamReader failed ...`` / ``UnpicklingError`` / ``Weights only load failed``, a line
  saying a checkpoint failed to load (``failed to load checkpoint``, ``unable to load checkpoint``,
  ``error loading checkpoint``, ...), our JSONL event ``"checkpoint_load_failed"``; or an exception
  (``SomethingError: ...``) after the log said a load began and before it said the load finished
  (Megatron's "loading checkpoint" followed by a traceback);
* **the load began and nothing followed it** — the log said a load began (Megatron
  ``loading checkpoint from``, torchtitan ``Loading the checkpoint``, NeMo/Lightning ``Restoring
  states from the checkpoint``, Hugging Face ``Loading model from``, JSONL
  ``"checkpoint_load_start"``) and the attempt ended without a training step or a finished-load
  line (Megatron ``successfully loaded checkpoint``, torchtitan ``Finished loading the
  checkpoint``, Lightning ``Restored all states``, JSONL ``"checkpoint_load_end"``) after it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import StrEnum

_EVENT = r"\"event\"\s*:\s*\"checkpoint_load_{}\""

_FAILED = re.compile(
    r"error\(s\) in loading state_dict|checkpointexception|pytorchstreamreader failed|unpicklingerror"
    r"|weights only load failed"
    r"|(?:failed|unable|could not|couldn't|cannot) (?:to )?(?:load|restore|read) (?:the |a |from )?(?:\w+ )?checkpoint"
    r"|error (?:while |when )?(?:loading|restoring) (?:the |a |from )?(?:\w+ )?checkpoint"
    r"|checkpoint (?:load|loading|restore) failed|" + _EVENT.format("failed"),
    re.IGNORECASE,
)
_ENDED = re.compile(
    r"successfully loaded (?:\w+ )?checkpoint|finished loading the checkpoint|restored all states from"
    r"|loaded checkpoint from|" + _EVENT.format("end"),
    re.IGNORECASE,
)
_BEGAN = re.compile(
    r"\bloading (?:the |a |release |distributed |latest |torch |sharded )?checkpoint"
    r"|restoring states from the checkpoint|\bloading model from\b|" + _EVENT.format("start"),
    re.IGNORECASE,
)
# every pattern above holds one of these words: looking for them (15x cheaper than a regular
# expression) rules out almost every line
_WORDS = ("load", "restor", "checkpoint", "pytorchstreamreader", "unpickling")
_EXCEPTION = re.compile(r"(?:^|[\s:\]])[A-Za-z_][\w.]*(?:Error|Exception): ")

MAX_LINE = 200


class LoadMark(StrEnum):
    """What a log line says of a checkpoint load."""

    BEGAN = "began"
    ENDED = "ended"
    FAILED = "failed"


def load_mark(line: str) -> LoadMark | None:
    """What ``line`` says of a checkpoint load, if anything. A failure wins over a start (a line
    ``Error loading checkpoint ...`` says both)."""
    lower = line.lower()
    if not any(word in lower for word in _WORDS):
        return None
    if _FAILED.search(line):
        return LoadMark.FAILED
    if _ENDED.search(line):
        return LoadMark.ENDED
    if _BEGAN.search(line):
        return LoadMark.BEGAN
    return None


def load_segments(lines: Sequence[str]) -> list[tuple[LoadMark | None, Sequence[str]]]:
    """``lines`` cut before each line that says something of a load: (that line's mark, the lines
    from it to the next such line). The first segment's mark is None when the lines do not begin
    with one. Feeding the segments to a parser in order is feeding it ``lines``: the caller learns
    which steps came after which mark."""
    cuts = [i for i, line in enumerate(lines) if load_mark(line) is not None]
    if not cuts:
        return [(None, lines)] if lines else []
    out: list[tuple[LoadMark | None, Sequence[str]]] = []
    if cuts[0] > 0:
        out.append((None, lines[: cuts[0]]))
    for i, start in enumerate(cuts):
        end = cuts[i + 1] if i + 1 < len(cuts) else len(lines)
        out.append((load_mark(lines[start]), lines[start:end]))
    return out


class LoadWatch:
    """What one attempt's log has said of its checkpoint load so far.

    ``mark(mark, line)`` for each marked line, ``stepped()`` for a training step, ``lines(lines)``
    for unmarked lines (an exception while a load is under way fails it). ``failure(ended=...)``:
    why the log shows the load failed, or None. ``before_load()``: the exception the attempt died
    of before any load began or any step — evidence that its failure is not the checkpoint's."""

    __slots__ = ("_began", "_early", "_failed", "_loading", "_quiet")

    def __init__(self) -> None:
        self._loading = False
        self._began = ""
        self._failed: str | None = None
        self._quiet = True  # no load mark and no step yet
        self._early: str | None = None  # the exception seen while still quiet

    def mark(self, mark: LoadMark, line: str) -> None:
        self._quiet, self._early = False, None
        if mark is LoadMark.FAILED:
            self._failed = _clip(line)
            self._loading = False
        elif mark is LoadMark.BEGAN:
            self._loading, self._began, self._failed = True, _clip(line), None
        else:
            self._loading = False

    def stepped(self) -> None:
        """A training step: a load under way finished (a step logged after a failure does not
        clear it: the demotion rule tells a checkpoint trained past on its own)."""
        self._loading = False
        self._quiet, self._early = False, None

    def lines(self, lines: Sequence[str]) -> None:
        """Unmarked lines with no step among them: an exception while loading fails the load; one
        before any load or step is what the attempt died of before its checkpoint mattered."""
        if self._quiet and self._early is None:
            self._early = next((_clip(line) for line in lines if _EXCEPTION.search(line)), None)
        if not self._loading:
            return
        for line in lines:
            if _EXCEPTION.search(line):
                self._failed = f"{_clip(line)} (after: {self._began})"
                self._loading = False
                return

    def failure(self, *, ended: bool) -> str | None:
        """Why the log shows the load failed: the error line, or — once the attempt ``ended`` — the
        load that began and was followed by neither a step nor a finished load."""
        if self._failed is not None:
            return f"its log shows a failed checkpoint load: {self._failed}"
        if ended and self._loading:
            return f"it began loading a checkpoint ({self._began}) and logged no step and no finished load after it"
        return None

    def before_load(self) -> str | None:
        """Why the attempt failed before its checkpoint mattered: the exception its log showed before
        any load began and before any step (an import error, a bad flag), when nothing followed it."""
        if self._early is None:
            return None
        return f"its log shows it failed before loading any checkpoint: {self._early}"


def _clip(line: str) -> str:
    line = line.strip()
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 3] + "..."
