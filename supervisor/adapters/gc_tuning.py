"""The daemon's garbage collector, set for a long-lived server that allocates quickly.

CPython collects its youngest generation every 700 net allocations of container objects; the
ingest makes a few dozen per report, so at ten thousand reports a second the collector ran a few
hundred times a second, each time also walking what the previous passes had kept. Reference
counting frees nearly everything a request makes the moment it is done; only cycles need the
collector, and they are rare here. So, once the daemon is wired: what exists then (modules,
configuration, the engine) is frozen out of every future pass (``gc.freeze``), and the youngest
generation is collected every 20,000 allocations — cyclic garbage is still freed, a little later.
Measured with ``bench/ingest.py``: about 8,000-10,000 reports/s before, 11,000-12,500 after
(docs/adr/0003).
"""

from __future__ import annotations

import gc

YOUNG = 20_000  # allocations between collections of the youngest generation (CPython: 700)
MIDDLE = 50  # young collections between collections of the middle one (CPython: 10)
OLD = 100  # middle collections between full ones, which CPython runs only when a quarter of the old is new


def settle() -> None:
    """Call once the daemon is wired, before it serves."""
    gc.freeze()
    gc.set_threshold(YOUNG, MIDDLE, OLD)
