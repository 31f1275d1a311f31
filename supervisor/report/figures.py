"""Numbers as a person writes them, for every rendering (terminal, Markdown, HTML): counts with
thousands separators, a restart limit that is really "no limit" as ``unlimited``, durations in
hours, minutes and seconds, step ranges with an en dash."""

from __future__ import annotations

# A restart limit this high is never reached by a real run: it stands for "no limit" (the simulator
# gives its runs 1,000,000 so that the budget never ends a simulation), and reads "unlimited".
UNLIMITED_RESTARTS = 1_000_000


def count(n: int) -> str:
    """``1234567`` as ``1,234,567``."""
    return f"{n:,}"


def restart_limit(limit: int) -> str:
    """The restart budget's limit: ``10``, ``1,000`` or ``unlimited``."""
    return "unlimited" if limit >= UNLIMITED_RESTARTS else count(limit)


def restarts(spent: int, limit: int) -> str:
    """Restarts spent against the limit: ``4 of 10``, ``4 of unlimited``."""
    return f"{count(spent)} of {restart_limit(limit)}"


def duration(s: float) -> str:
    """A duration as people say it: ``45 s``, ``2 min 11 s``, ``3 h 5 min``, ``2 d 4 h``."""
    whole = max(0, int(round(s)))
    if whole < 60:
        return f"{whole} s"
    d, rest = divmod(whole, 86400)
    h, rest = divmod(rest, 3600)
    m, sec = divmod(rest, 60)
    if d:
        return f"{d} d {h} h" if h else f"{d} d"
    if h:
        return f"{h} h {m} min" if m else f"{h} h"
    return f"{m} min {sec} s" if sec else f"{m} min"


def step_span(first: int, last: int) -> str:
    """Training steps from ``first`` to ``last``: ``steps 1840–4640`` (one step: ``step 80``).
    Step numbers are names of points in training, like job ids: no thousands separators."""
    return f"step {first}" if first == last else f"steps {first}–{last}"
