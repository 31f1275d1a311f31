"""One run spec for tests, changed only where a test needs it: ``spec(nodes=4, max_restarts=5)``.

The defaults are the simulated world's run (tests/unit/sim_world.py): two nodes of partition
``main``, a batch script that exists nowhere (the simulator and the fakes never read it).
"""

from __future__ import annotations

from typing import Any

from supervisor.domain.run import RunSpec

DEFAULTS: dict[str, Any] = {"name": "llm", "script": "/train.sbatch", "partition": "main", "nodes": 2}


def spec(**overrides: Any) -> RunSpec:
    """A ``RunSpec`` with the defaults above and ``overrides`` (any of its fields)."""
    return RunSpec(**{**DEFAULTS, **overrides})
