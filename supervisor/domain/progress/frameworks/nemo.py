"""NeMo's progress lines.

NeMo 1.x (PyTorch Lightning's tqdm bar; in a file the bar's refreshes are separated by ``\\r``)::

    Epoch 0:   1%|          | 795/77225 [9:07:58<878:01:48, 41.36s/it, loss=3.1, v_num=,
    reduced_train_loss=3.090, global_step=794.0, consumed_samples=1.63e+6]

NeMo 2 (``MegatronProgressBar`` as a plain-text logger)::

    Training epoch 0, iteration 120/149 | lr: 3e-05 | consumed_samples: 121 | global_batch_size: 1 |
    global_step: 120 | reduced_train_loss: 1.233 | train_step_timing in s: 0.03146 | val_loss: 4.106

The step is ``global_step``; NeMo 2 lines without it use the iteration. The loss is
``reduced_train_loss`` (else ``train_loss``, else Lightning's running ``loss``). The step time is
``train_step_timing in s``; for a NeMo 1.x bar without it, tqdm's smoothed rate (``41.36s/it``,
``3.50it/s``). Validation metrics are not extracted. NeMo runs that log through Megatron's own
``training_log`` print Megatron lines: see ``megatron.py``.
"""

from __future__ import annotations

import re

from supervisor.domain.progress.base import LineFormat, ScanResult
from supervisor.domain.progress.record import ProgressRecord, count, number, positive_reciprocal

NAME = "nemo"

_EPOCH = re.compile(r"Epoch\s{1,8}(\d{1,9})\b")
_COUNTER = re.compile(r"(?<![\d.])(\d{1,12})/(?:\d{1,12}|\?)\s?\[")
_NEMO2 = re.compile(r"Training epoch\s{1,8}(\d{1,9}),\s{0,8}iteration\s{1,8}(\d{1,12})/\d{1,12}\s{0,8}\|")


class NemoFormat(LineFormat):
    name = NAME

    def scan(self, text: str, rank: int | None) -> ScanResult:
        if "poch" not in text:
            return None
        m = _NEMO2.search(text)
        if m is not None:
            pairs = {}
            for seg in text[m.end() :].split("|"):
                key, sep, value = seg.partition(":")
                if sep:
                    pairs[key.strip()] = value.strip()
            return _record(pairs, m.group(1), m.group(2), rank, None)
        epoch = _EPOCH.search(text)
        if epoch is None:
            return None
        counter = _COUNTER.search(text, epoch.end())
        if counter is None:
            return None
        inner = text[counter.end() :]
        close = inner.rfind("]")
        pairs = {}
        period = None
        for item in (inner[:close] if close >= 0 else inner).split(","):
            key, sep, value = item.partition("=")
            if sep:
                pairs[key.strip()] = value.strip()
            else:
                period = _bar_period(item.strip()) or period
        if not _has_train_metric(pairs):
            return None
        return _record(pairs, epoch.group(1), None, rank, period)


def _has_train_metric(pairs: dict[str, str]) -> bool:
    return any(k in pairs for k in ("reduced_train_loss", "train_loss", "loss", "global_step"))


def _bar_period(item: str) -> float | None:
    """Seconds per iteration from tqdm's rate text ``41.36s/it`` or ``3.50it/s``."""
    if item.endswith("s/it"):
        return number(item[:-4])
    if item.endswith("it/s"):
        return positive_reciprocal(number(item[:-4]))
    return None


def _record(
    p: dict[str, str], epoch: str, iteration: str | None, rank: int | None, period: float | None
) -> ProgressRecord | None:
    get = p.get
    step = count(get("global_step"))
    if step is None and iteration is not None:
        step = int(iteration)
    loss_text = get("reduced_train_loss") or get("train_loss") or get("loss")
    step_time = number(get("train_step_timing in s"))
    return ProgressRecord(
        step=step,
        source_format=NAME,
        loss=number(loss_text),
        grad_norm=number(get("grad_norm")),
        lr=number(get("lr")),
        step_time_s=step_time if step_time is not None else period,
        consumed_samples=count(get("consumed_samples")),
        global_batch_size=count(get("global_batch_size")),
        epoch=float(epoch),
        rank=rank,
    )
