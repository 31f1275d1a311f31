"""Megatron's training-log line: Megatron-LM (2020 to now), Megatron-DeepSpeed (BigScience and
Microsoft forks), Megatron-Bridge / NeMo 2 with Megatron logging.

One grammar covers them all: ``iteration N/ TOTAL |`` followed by `` key: value |`` fields, with
an optional ``[YYYY-MM-DD hh:mm:ss]`` timestamp in front (Megatron-LM since 2024)::

     iteration      100/  500000 | consumed samples: 12800 | elapsed time per iteration (ms): 5444.9 |
     learning rate: 8.6E-06 | global batch size: 128 | lm loss: 1.825991E+00 | loss scale: 1.0 |
     grad norm: 1.426 | number of skipped iterations: 0 | number of nan iterations: 0 |

Megatron prints a loss only when its mean over the log interval is > 0; a NaN mean fails that test
and the loss disappears from the line. So a line without a loss and with zero skipped iterations
is flagged ``nonfinite`` (as is one with a nan-iteration count above zero); a line whose missing
loss is explained by skipped iterations (fp16 loss-scale warm-up) is not.

Speed: lines without ``iteration`` cost one substring test. An iteration line whose fields each
hold exactly one ``:`` is split at ``:`` and ``|`` at once; others (a value with a colon, a
cut-off line) segment by segment; a reassembled wrapped line also has its keys matched without
spaces. Every step is linear in the line's length (no regex that can backtrack).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from math import isfinite
from typing import Any

from supervisor.domain.progress.base import UNFINISHED, LineFormat, ScanResult
from supervisor.domain.progress.record import ProgressRecord, count, number

NAME = "megatron"

_ITER = re.compile(r"iteration\s{0,32}(\d{1,12})\s{0,32}/\s{0,32}\d{1,12}\s{0,32}\|")

# Every key Megatron variants print, including those not extracted, so that a reassembled line,
# whose keys may have lost or gained a space at the wrap, can be matched without spaces.
_KNOWN_KEYS = (
    "consumed samples",
    "consumed tokens",
    "elapsed time per iteration (ms)",
    "elapsed time per iteration (s)",
    "throughput per GPU (TFLOP/s/GPU)",
    "TFLOPs",
    "learning rate",
    "global batch size",
    "lm loss",
    "loss",
    "loss scale",
    "grad norm",
    "number of skipped iterations",
    "number of nan iterations",
    "samples per second",
    "num zeros",
    "params norm",
    "actual seqlen",
)
_SQUASHED = {"".join(k.split()).lower(): k for k in _KNOWN_KEYS}


class MegatronFormat(LineFormat):
    name = NAME

    def scan(self, text: str, rank: int | None) -> ScanResult:
        if "iteration" not in text:
            return None
        m = _ITER.search(text)
        if m is None or _nemo2(text, m.start()):
            return None
        if text[-1:] != "|" and not text.rstrip().endswith("|"):
            return UNFINISHED
        tail = text[m.end() :]
        if tail[:1] == " " and tail[1:2] != " " and tail.count(":") == tail.count("|"):
            # Megatron writes each field as ' {key}: {value} |': split at ':' and '|' alike and
            # the keys come out as ' key' (values keep their padding; float() and int() skip it).
            parts = tail.replace(":", "|").split("|")
            fields = dict(zip(parts[0::2], parts[1::2], strict=False))
        else:
            fields = {" " + key: value for key, value in _pairs(tail)}
        return _record(fields, int(m.group(1)), rank)

    def starts_record(self, text: str) -> bool:
        if "iteration" not in text:
            return False
        m = _ITER.search(text)
        return m is not None and not _nemo2(text, m.start())

    def continues(self, text: str) -> bool:
        return "|" in text and not self.starts_record(text)

    def finish(self, joined: str, rank: int | None, *, complete: bool) -> ScanResult:
        m = _ITER.search(joined)
        if m is None or _nemo2(joined, m.start()):
            return None
        if not complete and not joined.rstrip().endswith("|"):
            return UNFINISHED
        fields = {}
        for key, value in _pairs(joined[m.end() :]):
            canonical = _SQUASHED.get("".join(key.split()).lower(), key)
            fields[" " + canonical] = "".join(value.split())
        return _record(fields, int(m.group(1)), rank)


def _pairs(tail: str) -> list[tuple[str, str]]:
    """``(key, value)`` of each ``| key: value`` segment that has a colon, stripped."""
    out = []
    for segment in tail.split("|"):
        key, colon, value = segment.partition(":")
        if colon and key.strip():
            out.append((key.strip(), value.strip()))
    return out


def _nemo2(text: str, start: int) -> bool:
    """NeMo 2's ``Training epoch 0, iteration 120/149 | ...``: not a Megatron line."""
    return text[:start].rstrip().endswith(",")


def _record(fields: dict[str, str], step: int, rank: int | None) -> ProgressRecord:
    """The record of a line's fields, keyed ``' key'`` (with the space Megatron puts before it)."""
    try:  # the common case: every value a plain number
        values = _values(fields.get, float, int)
    except ValueError:  # nan.0, 9e+3 for a count, a cut-off value: the forgiving converters
        values = _values(fields.get, number, count)
    values["step"] = step
    values["rank"] = rank
    return ProgressRecord.from_values(values, checked=True)


def _values(
    get: Callable[[str], str | None],
    num: Callable[[str], float | None],
    cnt: Callable[[str], int | None],
) -> dict[str, Any]:
    loss_text = get(" lm loss") or get(" loss")
    loss = num(loss_text) if loss_text is not None else None
    grad_norm = num(t) if (t := get(" grad norm")) is not None else None
    skipped = cnt(t) if (t := get(" number of skipped iterations")) is not None else None
    nan_iters = cnt(t) if (t := get(" number of nan iterations")) is not None else None
    if (t := get(" elapsed time per iteration (ms)")) is not None:
        ms = num(t)
        step_time = round(ms / 1000.0, 9) if ms is not None and isfinite(ms) else ms
    else:
        step_time = num(t) if (t := get(" elapsed time per iteration (s)")) is not None else None
    tflops = get(" throughput per GPU (TFLOP/s/GPU)") or get(" TFLOPs")
    return {
        "source_format": NAME,
        "loss": loss,
        "grad_norm": grad_norm,
        "lr": num(t) if (t := get(" learning rate")) is not None else None,
        "step_time_s": step_time,
        "samples_per_s": num(t) if (t := get(" samples per second")) is not None else None,
        "tflops": num(tflops) if tflops is not None else None,
        "loss_scale": num(t) if (t := get(" loss scale")) is not None else None,
        "skipped_iters": skipped,
        "nan_iters": nan_iters,
        "consumed_samples": cnt(t) if (t := get(" consumed samples")) is not None else None,
        "consumed_tokens": cnt(t) if (t := get(" consumed tokens")) is not None else None,
        "global_batch_size": cnt(t) if (t := get(" global batch size")) is not None else None,
        "nonfinite": (nan_iters is not None and nan_iters > 0)
        or (loss_text is None and skipped == 0)
        or (loss is not None and not isfinite(loss))
        or (grad_norm is not None and not isfinite(grad_norm)),
    }
