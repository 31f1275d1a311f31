"""Our own JSONL progress protocol, version 1 (docs/telemetry-jsonl.md): one JSON object per line,
``{"ssv": 1, "step": 10, "loss": 2.3, "step_time_s": 0.5, "rank_step_times_s": [0.5, 0.52]}``.

Reading rules: the object is the rest of the line from its first ``{`` (so rank prefixes and
logger prefixes in front are fine); ``ssv`` must be the integer 1 and ``step`` a non-negative
integer, otherwise the line is not a record. Each other known field that has the wrong type is
ignored on its own; unknown fields are ignored. Numbers may be JSON numbers, Python's ``NaN`` /
``Infinity`` / ``-Infinity`` tokens, or the strings ``"nan"``, ``"inf"``, ``"-inf"``; ``null``
means absent, and inside ``rank_step_times_s`` means "no measurement" (NaN). ``rank_peer_groups``
is each rank's peer group (its pipeline stage, or any role id): ranks are compared with their peers
only; an element that is not a non-negative integer is -1 ("not said").
"""

from __future__ import annotations

import json
import math
from typing import Any

from supervisor.domain.progress.base import UNFINISHED, LineFormat, ScanResult
from supervisor.domain.progress.record import ProgressRecord, number

NAME = "ssv-jsonl"
VERSION = 1

FLOAT_FIELDS = (
    "loss",
    "grad_norm",
    "lr",
    "step_time_s",
    "tokens_per_s",
    "samples_per_s",
    "tflops",
    "loss_scale",
    "epoch",
)
INT_FIELDS = (
    "skipped_iters",
    "nan_iters",
    "consumed_samples",
    "consumed_tokens",
    "global_batch_size",
    "rank",
)
RANK_TIMES = "rank_step_times_s"
RANK_GROUPS = "rank_peer_groups"
MAX_RANKS = 1 << 20  # longer rank arrays are not read (a hostile or broken line)
MAX_GROUP = 1 << 31  # a peer group id at or above this is "not said" (it must fit an int64 array)

_DECODER = json.JSONDecoder()


class SsvJsonlFormat(LineFormat):
    name = NAME

    def scan(self, text: str, rank: int | None) -> ScanResult:
        if '"ssv"' not in text:
            return None
        brace = text.find("{")
        if brace < 0:
            return None
        if not text.rstrip().endswith("}"):
            return UNFINISHED
        return parse_object(text[brace:], rank)

    def starts_record(self, text: str) -> bool:
        return '"ssv"' in text and "{" in text

    def continues(self, text: str) -> bool:
        return "ssv" not in text

    def finish(self, joined: str, rank: int | None, *, complete: bool) -> ScanResult:
        brace = joined.find("{")
        if brace < 0:
            return None
        if not complete and not joined.rstrip().endswith("}"):
            return UNFINISHED
        return parse_object(joined[brace:], rank)


def parse_object(text: str, prefix_rank: int | None = None) -> ProgressRecord | None:
    """The record of one protocol object (the text from its ``{``); ``None`` when it is not one.
    A ``rank`` field wins over the rank of the line's prefix. Never raises."""
    try:
        doc, _ = _DECODER.raw_decode(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    version, step = doc.get("ssv"), doc.get("step")
    if type(version) is not int or version != VERSION:
        return None
    if type(step) is not int or step < 0:
        return None
    values: dict[str, Any] = {name: _float(doc.get(name)) for name in FLOAT_FIELDS}
    values.update({name: _int(doc.get(name)) for name in INT_FIELDS})
    if values["rank"] is None:
        values["rank"] = prefix_rank
    return ProgressRecord(
        step=step,
        source_format=NAME,
        per_rank_step_time_s=_times(doc.get(RANK_TIMES)),
        rank_peer_groups=_groups(doc.get(RANK_GROUPS)),
        **values,
    )


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float):
        return value
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:
            return math.copysign(math.inf, value)
    if isinstance(value, str) and value.strip().lower() in {"nan", "inf", "-inf", "+inf"}:
        return number(value)
    return None


def _int(value: Any) -> int | None:
    if type(value) is int and value >= 0:
        return value
    return None


def _times(value: Any) -> tuple[float, ...] | None:
    if not isinstance(value, list) or len(value) > MAX_RANKS:
        return None
    out = []
    for item in value:
        as_float = _float(item)
        out.append(math.nan if as_float is None else as_float)
    return tuple(out)


def _groups(value: Any) -> tuple[int, ...] | None:
    """Peer group ids per rank: non-negative integers; ``null`` or anything else is -1 (not said)."""
    if not isinstance(value, list) or len(value) > MAX_RANKS:
        return None
    return tuple(item if type(item) is int and 0 <= item < MAX_GROUP else -1 for item in value)
