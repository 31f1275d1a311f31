"""Node health findings: what the node itself (agent, hooks) or the simulator says about a node.

A finding is the output of the GPU-health rules (or of a simulated agent): a severity with its
reason, the rule that fired, and the evidence. The engine turns findings into actions:

* FATAL     drain now and restart the run without the node;
* DEGRADED  keep the node out at the run's next restart or checkpoint boundary;
* WATCH     record it; no action.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Severity(StrEnum):
    WATCH = "watch"
    DEGRADED = "degraded"
    FATAL = "fatal"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Severity.WATCH: 0, Severity.DEGRADED: 1, Severity.FATAL: 2}


@dataclass(frozen=True)
class NodeFinding:
    node: str
    severity: Severity
    reason: str  # one line for people and for Slurm's drain reason, e.g. "XID 79: GPU fallen off the bus (gpu 3)"
    rule: str  # the rule id and table version, e.g. "xid-79@1"
    at: float
    source: str = "agent"  # "agent", "prolog", "epilog", "healthcheck", "heartbeat", "sim"
    run: str | None = None  # the run whose token carried it, when known
    evidence: Mapping[str, Any] = field(default_factory=dict)
