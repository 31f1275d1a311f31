"""torchtitan's metrics line (colour codes already removed by the stream)::

    [rank0]:[titan] 2025-06-16 22:30:50,322 - root - INFO - step: 200  loss:  6.1384
    memory: 49.66GiB(52.28%)  tps: 5,856  tflops: 339.16  mfu: 34.29%

Extracted: step, loss, ``grad_norm`` (newer versions), ``tps`` (older: ``wps``; tokens per second
per GPU, thousands separated by commas) and ``tflops`` (per GPU), ``lr`` where printed. With
pipeline parallelism, ranks without the last stage print ``loss: -1.0000``: no loss, so the
record's loss is ``None``. torchtitan prints no step time.
"""

from __future__ import annotations

import re

from supervisor.domain.progress.base import LineFormat, ScanResult
from supervisor.domain.progress.record import ProgressRecord, number

NAME = "torchtitan"

_STEP = re.compile(r"\bstep:\s{0,16}(\d{1,12})\s")
_PAIR = re.compile(r"(?<![a-z_])([a-z_]{1,32}):\s{0,16}([-+]?[\w.,]{1,32})")
_MARKERS = ("tps:", "wps:", "mfu:", "memory:", "tflops:")


class TorchtitanFormat(LineFormat):
    name = NAME

    def scan(self, text: str, rank: int | None) -> ScanResult:
        if "step:" not in text or "loss:" not in text:
            return None
        if not any(marker in text for marker in _MARKERS):
            return None
        m = _STEP.search(text)
        if m is None:
            return None
        pairs = dict(_PAIR.findall(text, m.end()))
        get = pairs.get
        loss = number(get("loss"))
        if loss == -1.0:
            loss = None
        return ProgressRecord(
            step=int(m.group(1)),
            source_format=NAME,
            loss=loss,
            grad_norm=number(get("grad_norm")),
            lr=number(get("lr")),
            tokens_per_s=_thousands(get("tps") or get("wps")),
            tflops=number(get("tflops")),
            rank=rank,
        )


def _thousands(text: str | None) -> float | None:
    return number(text.replace(",", "")) if text is not None else None
