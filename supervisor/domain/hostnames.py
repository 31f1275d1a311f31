"""Node names folded into a Slurm hostlist ("n[0001-1071,1073-2048]"), as ``hostlist.collect_hostlist``
writes it, without its cost where names are the usual kind.

``collect_hostlist`` handles any names (several numeric fields, mixed widths, many prefixes) and
takes milliseconds for a 2,048-node job. Names that are one prefix of letters and a number of
one width — the way clusters name nodes — fold here in one sort; anything else is handed to it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import hostlist

_SIMPLE = re.compile(r"([A-Za-z_-]+)([0-9]+)")


def fold(names: Iterable[str]) -> str:
    """The hostlist of ``names`` (duplicates once), exactly as ``hostlist.collect_hostlist`` has it."""
    names = list(names)
    simple = _one_prefix_one_width(names)
    if simple is None or len(set(names)) < 2:
        return str(hostlist.collect_hostlist(names))
    prefix, width = simple
    numbers = sorted({int(name[len(prefix) :]) for name in names})
    return f"{prefix}[{','.join(_ranges(numbers, width))}]"


def _one_prefix_one_width(names: list[str]) -> tuple[str, int] | None:
    """(prefix, digits) when every name is the same prefix of letters and a number of as many
    ASCII digits; else None."""
    first = _SIMPLE.fullmatch(names[0]) if names else None
    if first is None:
        return None
    prefix, width = first.group(1), len(first.group(2))
    size = len(prefix) + width
    for name in names:
        if len(name) != size or not name.startswith(prefix) or not (name.isascii() and name[len(prefix) :].isdigit()):
            return None
    return prefix, width


def _ranges(numbers: list[int], width: int) -> list[str]:
    """Runs of consecutive numbers, "first-last" (or "n" alone), zero-padded to ``width``."""
    out: list[str] = []
    first = last = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == last + 1:
            last = n
            continue
        out.append(f"{first:0{width}d}" if first == last else f"{first:0{width}d}-{last:0{width}d}")
        if n is not None:
            first = last = n
    return out
