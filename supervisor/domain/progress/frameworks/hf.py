"""Hugging Face Trainer: the console dicts and ``trainer_state.json``.

Console (``ProgressCallback``/``PrinterCallback`` print the logged dict)::

    {'loss': 0.2051, 'grad_norm': nan, 'learning_rate': 9.774074342405685e-06, 'epoch': 0.53}

The dict has no step. When the Trainer's tqdm bar is in the same stream (``  5%|▌  | 50/1000
[00:30<09:30,  1.66it/s]``, refreshes separated by ``\\r``), the step is the training bar's
counter at the time the dict was printed and the step time is the bar's smoothed rate; without a
bar the step is ``None``. The training bar is the one with the largest total seen so far
(evaluation bars are shorter). Dicts without ``loss`` (evaluation, the final summary) are not
progress records.

``trainer_state.json``: each ``log_history`` entry with a ``loss`` is one record (its ``step``,
``loss``, ``grad_norm``, ``learning_rate``, ``epoch``).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from supervisor.domain.progress.base import UNFINISHED, LineFormat, ScanResult
from supervisor.domain.progress.record import ProgressRecord, count, number, positive_reciprocal

NAME = "hf-trainer"

_PAIR = re.compile(r"'([^'\\]{1,64})':\s*('[^'\\]*'|\"[^\"\\]*\"|[^,{}]+)")
_BAR = re.compile(r"(?<![\d.])(\d{1,12})/(\d{1,12})\s?\[")


class HfTrainerFormat(LineFormat):
    name = NAME

    def __init__(self) -> None:
        self._bar_total = 0
        self._bar_step: int | None = None
        self._bar_period: float | None = None

    def scan(self, text: str, rank: int | None) -> ScanResult:
        body = text.strip()
        if body.startswith("{'"):
            if not body.endswith("}"):
                return UNFINISHED
            return self._dict(body, rank)
        if "/" in body and "[" in body:
            self._observe_bar(body)
        return None

    def starts_record(self, text: str) -> bool:
        return text.lstrip().startswith("{'")

    def continues(self, text: str) -> bool:
        return "'" in text or "}" in text

    def finish(self, joined: str, rank: int | None, *, complete: bool) -> ScanResult:
        body = joined.strip()
        if not body.endswith("}"):
            return None if complete else UNFINISHED
        return self._dict(body, rank)

    def _observe_bar(self, text: str) -> None:
        m = _BAR.search(text)
        if m is None:
            return
        step, total = int(m.group(1)), int(m.group(2))
        if total < self._bar_total:
            return
        self._bar_total = total
        self._bar_step = step
        period = None
        inner = text[m.end() :]
        close = inner.rfind("]")
        for item in (inner[:close] if close >= 0 else inner).split(","):
            item = item.strip()
            if item.endswith("s/it"):
                period = number(item[:-4])
            elif item.endswith("it/s"):
                period = positive_reciprocal(number(item[:-4]))
        self._bar_period = period

    def _dict(self, body: str, rank: int | None) -> ProgressRecord | None:
        pairs = {k: v.strip().strip("'\"") for k, v in _PAIR.findall(body)}
        if "loss" not in pairs:
            return None
        step = count(pairs.get("step"))
        period = None
        if step is None:
            step, period = self._bar_step, self._bar_period
        return ProgressRecord(
            step=step,
            source_format=NAME,
            loss=number(pairs["loss"]),
            grad_norm=number(pairs.get("grad_norm")),
            lr=number(pairs.get("learning_rate")),
            step_time_s=period,
            epoch=number(pairs.get("epoch")),
            rank=rank,
        )


def parse_trainer_state(text: str) -> list[ProgressRecord]:
    """The training records of a ``trainer_state.json`` document; ``[]`` when the text is not one.
    Never raises."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return []
    history = doc.get("log_history") if isinstance(doc, dict) else None
    if not isinstance(history, list):
        return []
    return [r for r in (_entry(e) for e in history) if r is not None]


def _entry(entry: Any) -> ProgressRecord | None:
    if not isinstance(entry, dict) or "loss" not in entry:
        return None
    step = entry.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        step = _json_int(step)
    return ProgressRecord(
        step=step,
        source_format=NAME,
        loss=_json_float(entry.get("loss")),
        grad_norm=_json_float(entry.get("grad_norm")),
        lr=_json_float(entry.get("learning_rate")),
        epoch=_json_float(entry.get("epoch")),
    )


def _json_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            return float(value)
        except OverflowError:
            return math.copysign(math.inf, value)
    if isinstance(value, str):
        return number(value)
    return None


def _json_int(value: Any) -> int | None:
    as_float = _json_float(value)
    if as_float is None or not math.isfinite(as_float):
        return None
    return int(as_float)
