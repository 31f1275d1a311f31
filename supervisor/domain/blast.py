"""The blast radius: how many nodes the supervisor may still take out of service, counted over the
node changes it made (a typed record per DOWN or DRAIN, never read back from the intent journal's
parameters or the logbook). Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

WINDOW_S = 3600.0  # the caps are per hour


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


def drains_left(changes: Iterable[NodeChangeRecord], run: str, now: float, caps: BlastRadius) -> int:
    """Distinct nodes the supervisor may still take out of service for ``run`` now."""
    recent = [c for c in changes if now - WINDOW_S <= c.at <= now]
    everywhere = len({c.node for c in recent})
    mine = len({c.node for c in recent if c.run == run})
    return max(0, min(caps.per_hour - everywhere, caps.per_run_per_hour - mine))
