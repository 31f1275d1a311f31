"""Report training progress to slurm-supervisor: one JSON line per call (protocol ``ssv`` 1,
docs/telemetry-jsonl.md).

    from supervisor.telemetry.jsonl import report

    report(step, loss=loss.item(), step_time_s=dt, tokens_per_s=tps)
    report(step, loss=loss, step_time_s=dt, rank_step_times_s=all_gathered_times)  # rank 0 only

Standard library only, and no import of the rest of slurm-supervisor: this file may be copied into
a trainer's code base. Call it from one rank (usually the last pipeline stage or rank 0) unless
each rank's own line is wanted (then pass ``rank=``). The line goes to ``stream`` (default:
``sys.stdout``, which Slurm writes to the job's output file) and is flushed at once, so the
supervisor sees progress as it happens.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable
from typing import Any, TextIO

PROTOCOL_VERSION = 1

FLOAT_FIELDS = frozenset(
    {
        "loss",
        "grad_norm",
        "lr",
        "step_time_s",
        "tokens_per_s",
        "samples_per_s",
        "tflops",
        "loss_scale",
        "epoch",
    }
)
COUNT_FIELDS = frozenset(
    {
        "skipped_iters",
        "nan_iters",
        "consumed_samples",
        "consumed_tokens",
        "global_batch_size",
        "rank",
    }
)
RANK_TIMES = "rank_step_times_s"


def encode(step: int, **metrics: Any) -> str:
    """The protocol line (without newline) for ``step`` and ``metrics``.

    Metric values may be anything ``float()`` / ``int()`` accepts (Python numbers, NumPy scalars,
    one-element tensors); ``None`` leaves a metric out. NaN and infinities are written as
    ``NaN``, ``Infinity``, ``-Infinity``. ``TypeError`` for an unknown metric name, ``ValueError``
    for a negative step or count.
    """
    step = _count("step", step)
    doc: dict[str, Any] = {"ssv": PROTOCOL_VERSION, "step": step}
    for name, value in metrics.items():
        if value is None:
            continue
        if name in FLOAT_FIELDS:
            doc[name] = float(value)
        elif name in COUNT_FIELDS:
            doc[name] = _count(name, value)
        elif name == RANK_TIMES:
            doc[name] = _times(value)
        else:
            known = ", ".join(sorted(FLOAT_FIELDS | COUNT_FIELDS | {RANK_TIMES}))
            raise TypeError(f"report() got an unknown metric {name!r}; known: {known}")
    return json.dumps(doc)


def report(step: int, *, stream: TextIO | None = None, **metrics: Any) -> str:
    """Write the protocol line for ``step`` and ``metrics`` to ``stream`` (default ``sys.stdout``)
    and flush it. Returns the line written (without newline). See ``encode`` for the values."""
    line = encode(step, **metrics)
    out = sys.stdout if stream is None else stream
    out.write(line + "\n")
    out.flush()
    return line


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    as_int = int(value)
    if as_int < 0:
        raise ValueError(f"{name} must not be negative, got {value!r}")
    return as_int


def _times(values: Iterable[Any]) -> list[float | None]:
    out: list[float | None] = []
    for v in values:
        if v is None:
            out.append(None)
            continue
        as_float = float(v)
        out.append(None if math.isnan(as_float) else as_float)
    return out
