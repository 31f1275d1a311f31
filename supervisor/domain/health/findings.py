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

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "severity": self.severity.value,
            "reason": self.reason,
            "rule": self.rule,
            "at": self.at,
            "source": self.source,
            "run": self.run,
            "evidence": dict(self.evidence),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NodeFinding:
        return cls(
            node=str(d["node"]),
            severity=Severity(d["severity"]),
            reason=str(d["reason"]),
            rule=str(d["rule"]),
            at=float(d["at"]),
            source=str(d.get("source") or "agent"),
            run=None if d.get("run") is None else str(d["run"]),
            evidence=dict(d.get("evidence") or {}),
        )


@dataclass(frozen=True)
class HeartbeatSettings:
    timeout_s: float = 15.0  # an agent silent this long is suspect (3 × the default 5 s sample interval)
    startup_grace_s: float = 120.0  # agents need time to start with the job


def stale_heartbeats(
    nodes: tuple[str, ...], ages: Mapping[str, float], running_for: float, settings: HeartbeatSettings
) -> dict[str, str]:
    """Nodes of a running job whose agent went silent while agents on other nodes of the same job
    still report: the node itself is stuck (frozen, kernel hang), not the network to the daemon
    or the daemon's ingest. A node that never reported is not judged (no agent there). A one-node
    job has no peer to compare with and is left to Slurm."""
    if running_for < settings.startup_grace_s:
        return {}
    # a report older than this incarnation (an earlier job's agent on the node) counts as none
    known = {n: ages[n] for n in nodes if n in ages and ages[n] < running_for}
    fresh = [n for n, age in known.items() if age <= settings.timeout_s]
    if not fresh:
        return {}
    return {
        n: (
            f"node agent silent for {age:.1f} s while {len(fresh)} other node(s) of the job report; "
            "Slurm still calls the node responding"
        )
        for n, age in sorted(known.items())
        if age > settings.timeout_s
    }


def worst(findings: list[NodeFinding]) -> dict[str, NodeFinding]:
    """Per node, the most severe finding (the newest among equals)."""
    out: dict[str, NodeFinding] = {}
    for f in findings:
        cur = out.get(f.node)
        if cur is None or f.severity.rank > cur.severity.rank or (f.severity is cur.severity and f.at >= cur.at):
            out[f.node] = f
    return out
