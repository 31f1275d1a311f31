"""fairseq and metaseq (OPT's fork) progress lines, in their three log formats.

JSON (``--log-format json``; metaseq's ``train_inner``; values are strings)::

    2021-11-18 ... | INFO | train_inner | {"epoch": 1, "update": 0.267, "loss": "8.206", "ppl": "...",
    "wps": "1195.4", "ups": "1.62", "num_updates": "33700", "lr": "0.00017", "gnorm": "1.833", ...}

simple/tqdm, per log interval (``key=value``)::

    epoch 001:    100 / 1000 loss=9.55, nll_loss=..., wps=962, ups=1.6, num_updates=100, lr=..., gnorm=2.14

epoch summary (``| key value |``)::

    epoch 001 | loss 9.3 | ppl ... | wps 1234 | ups 1.2 | num_updates 100 | lr ... | gnorm ... |

The step is ``num_updates`` (``None`` in very old versions that did not print it). ``loss`` is
fairseq's (base 2). ``wps`` is tokens ("words") per second for the whole job; ``ups`` is updates
per second, so the step time is ``1/ups`` (a mean over the log interval). Epoch summaries with a
``train_`` prefix (JSON) or a ``train`` tag are read the same way; validation lines are skipped.
"""

from __future__ import annotations

import json
import re
from typing import Any

from supervisor.domain.progress.base import LineFormat, ScanResult
from supervisor.domain.progress.record import ProgressRecord, count, number, positive_reciprocal

NAME = "fairseq"

_INNER = re.compile(r"epoch\s{1,8}(\d{1,9})\s{0,8}:?\s{1,16}\d{1,12}\s{0,8}/\s{0,8}\d{1,12}\s")
_KV = re.compile(r"(?<![A-Za-z_])([A-Za-z_]{1,64})=([^,\s]{1,64})")
_SUMMARY = re.compile(r"epoch\s{1,8}(\d{1,9})\s{0,8}\|")


class FairseqFormat(LineFormat):
    name = NAME

    def scan(self, text: str, rank: int | None) -> ScanResult:
        if "loss" not in text:
            return None
        brace = text.find("{")
        if brace >= 0 and '"epoch"' in text:
            return _json(text[brace:], rank)
        if "epoch" not in text or "valid" in text:
            return None
        m = _INNER.search(text)
        if m is not None:
            return _record(dict(_KV.findall(text, m.end())), m.group(1), rank)
        m = _SUMMARY.search(text)
        if m is None:
            return None
        pairs: dict[str, str] = {}
        for seg in text[m.end() :].split("|"):
            words = seg.split()
            if len(words) >= 2:
                key = "_".join(words[:-1])
                pairs[key.removeprefix("train_")] = words[-1]
        return _record(pairs, m.group(1), rank)


def _json(text: str, rank: int | None) -> ProgressRecord | None:
    try:
        doc, _ = json.JSONDecoder().raw_decode(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or "ssv" in doc:
        return None
    pairs = {str(k).removeprefix("train_"): _text(v) for k, v in doc.items()}
    if "loss" not in pairs or "epoch" not in pairs:
        return None
    return _record(pairs, pairs["epoch"], rank)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _record(p: dict[str, str], epoch: str | None, rank: int | None) -> ProgressRecord | None:
    get = p.get
    if "loss" not in p:
        return None
    return ProgressRecord(
        step=count(get("num_updates")),
        source_format=NAME,
        loss=number(get("loss")),
        grad_norm=number(get("gnorm")),
        lr=number(get("lr")),
        step_time_s=positive_reciprocal(number(get("ups"))),
        tokens_per_s=number(get("wps") or get("words/s")),
        loss_scale=number(get("loss_scale")),
        epoch=number(epoch),
        rank=rank,
    )
