"""One progress report of a training job, as a plain frozen value, and the number parsing that the
log parsers share.

A record is what one log line (or one reassembled, terminal-wrapped line) says about the job's
progress. Fields a format does not print stay ``None``: nothing is derived from other fields
except where the field's comment says so. Non-finite values are kept as ``float('nan')`` /
``float('inf')``; ``nonfinite`` says whether the line shows (or, for Megatron, implies) a NaN or
Inf loss or gradient norm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class ProgressRecord:
    """What one progress line reports.

    ``step`` is the optimizer step (iteration) as the trainer prints it. It is ``None`` only where
    the line does not print one: Hugging Face Trainer console dicts without a progress bar in the
    same stream, a NeMo 1.x bar without ``global_step``, lines of old fairseq versions.
    """

    step: int | None
    source_format: str = ""
    loss: float | None = None
    grad_norm: float | None = None
    lr: float | None = None
    step_time_s: float | None = None  # seconds per step (Megatron: mean over the log interval)
    tokens_per_s: float | None = None  # as printed: torchtitan's tps is per GPU, fairseq's wps per job
    samples_per_s: float | None = None
    tflops: float | None = None  # model TFLOP/s per GPU as the trainer reports it
    loss_scale: float | None = None
    skipped_iters: int | None = None  # Megatron: skipped iterations in the log interval
    nan_iters: int | None = None  # Megatron: iterations with a NaN/Inf loss in the log interval
    consumed_samples: int | None = None
    consumed_tokens: int | None = None
    global_batch_size: int | None = None
    epoch: float | None = None
    rank: int | None = None  # from a multi-rank prefix, or the reporting rank of a JSONL line
    per_rank_step_time_s: tuple[float, ...] | None = None  # index = rank; NaN = no measurement
    rank_peer_groups: tuple[int, ...] | None = None  # index = rank: its peer group (stage); -1 = not said
    nonfinite: bool = False

    def __post_init__(self) -> None:
        if not self.nonfinite and (not _finite(self.loss) or not _finite(self.grad_norm)):
            object.__setattr__(self, "nonfinite", True)

    @classmethod
    def from_values(cls, values: dict[str, Any], *, checked: bool = False) -> ProgressRecord:
        """The record with these field values (``values`` is taken over, not copied), built
        without the generated ``__init__``: the parsers' hot path, four times cheaper than a frozen
        dataclass's field-by-field ``object.__setattr__``. Keys must be field names and include
        ``step``; missing fields keep their defaults (class attributes); ``nonfinite`` is derived
        as in ``__init__`` unless ``checked`` says the caller did it. Equal to
        ``ProgressRecord(**values)``."""
        if (
            not checked
            and not values.get("nonfinite")
            and (not _finite(values.get("loss")) or not _finite(values.get("grad_norm")))
        ):
            values["nonfinite"] = True
        record = _new(cls)
        _setattr(record, "__dict__", values)
        return record

    def as_dict(self, *, omit_none: bool = True) -> dict[str, Any]:
        """The fields as a plain dict (tuples become lists); ``None`` fields left out by default."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and omit_none:
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


_new = object.__new__
_setattr = object.__setattr__

FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(ProgressRecord))


def _finite(value: float | None) -> bool:
    return value is None or math.isfinite(value)


# ---------------------------------------------------------------------------- numbers

_NAN = float("nan")
_INF = float("inf")


def number(text: str | None) -> float | None:
    """A float from log text: ``2.3``, ``1.2E-05``, ``nan``, ``nan.0`` (NeMo), ``-inf``,
    ``Infinity``. Anything else is ``None``; never raises."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    t = text.strip().lower()
    if t.startswith(("nan", "-nan", "+nan")):
        return _NAN
    if t.startswith(("inf", "+inf")):
        return _INF
    if t.startswith("-inf"):
        return -_INF
    return None


def count(text: str | None) -> int | None:
    """An integer from log text (``42``, ``42.0``, ``9e+3``, ``1.63e+6``); ``None`` when the text is
    not a finite number; never raises."""
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        pass
    value = number(text)
    if value is None or not math.isfinite(value):
        return None
    return int(value)


def positive_reciprocal(value: float | None) -> float | None:
    """``1 / value`` for a positive finite value (a rate turned into a period), else ``None``."""
    if value is None or not math.isfinite(value) or value <= 0.0:
        return None
    return 1.0 / value
