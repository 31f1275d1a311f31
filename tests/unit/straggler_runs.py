"""What the straggler tests share: feeding step times to a scorer row by row."""

from __future__ import annotations

import numpy as np

from supervisor.domain.pace.stragglers import StragglerScorer


def first_named(scorer: StragglerScorer, x: np.ndarray) -> dict[int, int]:
    """Step at which each node was first named (``x``: steps x nodes)."""
    named: dict[int, int] = {}
    for t, row in enumerate(x):
        for v in scorer.update(row):
            named.setdefault(v.node, t)
    return named
