"""Report training progress to slurm-supervisor: one JSON line per call (protocol ``ssv`` 1,
docs/telemetry-jsonl.md).

    from supervisor.telemetry.jsonl import report

    report(step, loss=loss.item(), step_time_s=dt, tokens_per_s=tps)
    report(step, loss=loss, step_time_s=dt, rank_step_times_s=all_gathered_times,  # rank 0 only
           rank_peer_groups=megatron_peer_groups(world_size, pipeline=pp, tensor=tp))
    report(step, rank=rank)  # each rank, for itself: who stopped, when the job hangs

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
RANK_GROUPS = "rank_peer_groups"
MEGATRON_ORDER = "tp-cp-ep-dp-pp"  # Megatron-LM's default --rank-order: tp varies fastest


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
        elif name == RANK_GROUPS:
            doc[name] = [_count(name, v) for v in value]
        else:
            known = ", ".join(sorted(FLOAT_FIELDS | COUNT_FIELDS | {RANK_TIMES, RANK_GROUPS}))
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


def megatron_peer_groups(
    world_size: int,
    pipeline: int,
    tensor: int = 1,
    context: int = 1,
    order: str = MEGATRON_ORDER,
) -> list[int]:
    """Each rank's pipeline stage under Megatron-style rank ordering: the ``rank_peer_groups`` to
    report, so that a rank is compared only with ranks doing the same work (the first and last
    stages, with the embedding and the loss, are slower by design).

    ``order`` lists the parallel dimensions from fastest- to slowest-varying (Megatron's
    ``--rank-order``, torchtitan's mesh read right to left: ``"tp-cp-dp-pp"``); the data-parallel
    size is what is left of ``world_size``; ``ep`` is a split of data parallelism in Megatron and
    does not move the stage. ``ValueError`` when the sizes do not divide ``world_size``."""
    sizes = {"tp": tensor, "cp": context, "pp": pipeline, "ep": 1}
    if min(world_size, pipeline, tensor, context) < 1 or world_size % (pipeline * tensor * context):
        raise ValueError(f"world size {world_size} is not a multiple of pp x tp x cp = {pipeline * tensor * context}")
    sizes["dp"] = world_size // (pipeline * tensor * context)
    dims = order.split("-")
    missing = [d for d, n in sizes.items() if n > 1 and d not in dims]
    if "pp" not in dims or missing or any(d not in sizes for d in dims) or len(set(dims)) != len(dims):
        raise ValueError(f"rank order {order!r}: dimensions among tp, cp, ep, dp, pp, each once, pp included")
    stride = 1
    for dim in dims[: dims.index("pp")]:
        stride *= sizes[dim]
    return [(rank // stride) % pipeline for rank in range(world_size)]


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
