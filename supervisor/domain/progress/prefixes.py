"""What launchers put in front of a trainer's lines: rank prefixes and terminal colour codes.

* torchrun / torch.distributed.elastic with ``--tee``/``--log-dir``: ``[default7]:`` (role name plus
  local rank), ``[rank3]:`` (PyTorch's per-rank logging);
* ``srun --label``: ``3: `` (the task id; srun pads it with spaces to a common width).

Up to three stacked prefixes are removed (``0: [default3]:[rank3]: ...``). The rank recorded is the
``[rankN]`` one when present (a global rank), else srun's task id, else the torchrun role's local
rank.
"""

from __future__ import annotations

import re

_PREFIX = re.compile(r" {0,8}(?:\[([A-Za-z_]{0,32}?)(\d{1,7})\]:|(\d{1,7}): )")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences (colours, cursor movement)."""
    if "\x1b" not in text:
        return text
    return _ANSI.sub("", text)


def split_prefix(text: str) -> tuple[int | None, str]:
    """``(rank, rest)``: the rank named by the line's multi-rank prefixes (``None`` without any) and
    the text after them."""
    m = _PREFIX.match(text)
    if m is None:
        return None, text
    rest = text[m.end() :]
    if _PREFIX.match(rest) is None:  # the common case: one prefix
        role, bracketed, label = m.group(1, 2, 3)
        return int(label if label is not None else bracketed), rest
    return _stacked(text)


def _stacked(text: str) -> tuple[int | None, str]:
    task = local = global_ = None
    for _ in range(3):
        m = _PREFIX.match(text)
        if m is None:
            break
        role, bracketed, label = m.group(1, 2, 3)
        if label is not None:
            task = int(label) if task is None else task
        elif role == "rank":
            global_ = int(bracketed) if global_ is None else global_
        else:
            local = int(bracketed) if local is None else local
        text = text[m.end() :]
    if global_ is not None:
        return global_, text
    return (task if task is not None else local), text


def has_prefix(text: str) -> bool:
    return _PREFIX.match(text) is not None
