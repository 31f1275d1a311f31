"""The blast radius: how many nodes the supervisor may still take out of service, counted over the
node changes it made (a typed record per DOWN or DRAIN, never read back from the intent journal's
parameters or the logbook) and the nodes its Slurm hooks drained (seen drained with the hooks'
reason, or Slurm's "Prolog error"). Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from supervisor.domain.cluster import NodeInfo

WINDOW_S = 3600.0  # the caps are per hour
# The reason the healthcheck hook drains a node with (supervisor/agent/hooks.py). A failed prolog
# or epilog makes slurmd drain the node ("Prolog error": NodeInfo.prolog_failed).
HOOK_REASON_PREFIX = "slurm-supervisor healthcheck:"


@dataclass(frozen=True)
class NodeChangeRecord:
    """A node this supervisor set DOWN or DRAIN in Slurm, for ``run``, at ``at``. ``intent``: the
    journaled action that did it (recording it again after a crash stores it once)."""

    node: str
    run: str
    change: str  # "DOWN" or "DRAIN"
    at: float
    reason: str = ""
    intent: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "run": self.run,
            "change": self.change,
            "at": self.at,
            "reason": self.reason,
            "intent": self.intent,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NodeChangeRecord:
        intent = d.get("intent")
        return cls(
            str(d["node"]),
            str(d["run"]),
            str(d["change"]),
            float(d["at"]),
            str(d.get("reason") or ""),
            None if intent is None else int(intent),
        )


@dataclass(frozen=True)
class BlastRadius:
    per_hour: int = 8  # nodes taken out of service in any hour, across every run
    per_run_per_hour: int = 4  # ... by one run


@dataclass(frozen=True)
class HookDrain:
    """A node seen drained by a Slurm hook, first seen so at ``at`` (the snapshot carries no time
    of its own: a node already drained when the daemon starts counts from then)."""

    node: str
    at: float


def hook_drained(nodes: Iterable[NodeInfo]) -> frozenset[str]:
    """The nodes Slurm shows drained by the supervisor's hooks: the healthcheck's reason, or a
    failed prolog/epilog."""
    return frozenset(
        n.name for n in nodes if n.drained and (n.reason.startswith(HOOK_REASON_PREFIX) or n.prolog_failed)
    )


def track_hook_drains(seen: Mapping[str, float], drained: Iterable[str], now: float) -> dict[str, float]:
    """When each node now drained by a hook was first seen so; a node no longer drained is forgotten."""
    return {node: seen.get(node, now) for node in sorted(set(drained))}


def drains_left(
    changes: Iterable[NodeChangeRecord],
    run: str,
    now: float,
    caps: BlastRadius,
    hook_drains: Iterable[HookDrain] = (),
    run_nodes: Iterable[str] = (),
) -> int:
    """Distinct nodes the supervisor may still take out of service for ``run`` now. A node a hook
    drained within the window counts everywhere, and against ``run``'s own cap when it is one of
    ``run_nodes`` (the nodes of the run's current attempt)."""
    recent = [c for c in changes if now - WINDOW_S <= c.at <= now]
    hooked = {h.node for h in hook_drains if now - WINDOW_S <= h.at <= now}
    everywhere = len({c.node for c in recent} | hooked)
    mine = len({c.node for c in recent if c.run == run} | (hooked & set(run_nodes)))
    return max(0, min(caps.per_hour - everywhere, caps.per_run_per_hour - mine))
