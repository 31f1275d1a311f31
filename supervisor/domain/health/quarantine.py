"""Bad-node memory across runs ("lemon" nodes): a node that faults again and again is quarantined.

Every run's faults go into one history. A node with ``faults`` or more faults within ``window_s``
is quarantined: every run's next submissions keep it out, even after an administrator resumes it
in Slurm, until the quarantine decays — ``base_s`` for the first, doubling with each further
fault in the window, at most ``max_s``. Operators list quarantined nodes and clear them; a clear
forgets the faults before it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

WHEN_SHORT = ("use-least-bad", "wait")
# Doublings past this change nothing (2**64 base holds outlast any max_s) and keep ``base_s * 2**n``
# a float: 2**1025 no longer fits one, and the OverflowError took the guard's answers down for every
# instance (review 2026-12-02, finding 2).
MAX_DOUBLINGS = 64


@dataclass(frozen=True)
class QuarantineSettings:
    faults: int = 2
    window_s: float = 7 * 86400.0
    base_s: float = 86400.0
    max_s: float = 30 * 86400.0
    # When a run cannot be placed without quarantined nodes that Slurm has in service: use the
    # least-bad of them (fewest faults, oldest last fault), or wait for other nodes. Either way the
    # logbook says so: quarantine never holds a run without a decision on record.
    when_short: str = "use-least-bad"

    def __post_init__(self) -> None:
        if self.when_short not in WHEN_SHORT:
            raise ValueError(f"quarantine when_short: {self.when_short!r}; choose from {', '.join(WHEN_SHORT)}")


@dataclass(frozen=True)
class Fault:
    """A fault pinned on one node in a run: what quarantine counts. ``key`` makes recording it
    idempotent (one fault per run, attempt and node however often the decision is retried)."""

    node: str
    at: float
    run: str
    reason: str
    key: str = ""
    source: str = "fault"  # what pinned it: "fault" (the run's decision on a node of its job)

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "at": self.at,
            "run": self.run,
            "reason": self.reason,
            "key": self.key,
            "source": self.source,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Fault:
        return cls(
            str(d["node"]),
            float(d["at"]),
            str(d["run"]),
            str(d["reason"]),
            str(d.get("key") or ""),
            str(d.get("source") or "fault"),
        )


@dataclass(frozen=True)
class Quarantine:
    node: str
    since: float  # the fault that tipped it over
    until: float
    faults: tuple[Fault, ...]

    @property
    def badness(self) -> tuple[int, float]:
        """Orders quarantined nodes from least to most bad: fewer faults, then older last fault."""
        return (len(self.faults), self.since)

    @property
    def reason(self) -> str:
        runs = sorted({f.run for f in self.faults})
        return (
            f"quarantined: {len(self.faults)} faults in {len(runs)} run(s) "
            f"({'; '.join(f.reason for f in self.faults[-3:])})"
        )[:300]


def quarantined(
    history: Iterable[Fault],
    cleared: Mapping[str, float],
    now: float,
    settings: QuarantineSettings = QuarantineSettings(),
) -> dict[str, Quarantine]:
    """The nodes under quarantine at ``now``, from the fault history and operators' clears."""
    by_node: dict[str, list[Fault]] = {}
    for f in history:
        if f.at > cleared.get(f.node, float("-inf")) and f.at <= now:
            by_node.setdefault(f.node, []).append(f)
    out: dict[str, Quarantine] = {}
    for node, faults in by_node.items():
        faults.sort(key=lambda f: f.at)
        recent = [f for f in faults if f.at >= faults[-1].at - settings.window_s]
        if len(recent) < settings.faults:
            continue
        extra = len(recent) - settings.faults
        until = recent[-1].at + min(settings.max_s, settings.base_s * 2.0 ** min(extra, MAX_DOUBLINGS))
        if until > now:
            out[node] = Quarantine(node, recent[-1].at, until, tuple(recent))
    return out


@dataclass(frozen=True)
class ProbationSettings:
    """A node back from a fault is on probation for ``hold_s`` after its return: still usable as
    a spare or by runs of at most ``max_run_nodes`` nodes, kept out of bigger ones. Why 2 days:
    on the public InfiniteHBD trace (docs/fault-trace.md) a repeat fault comes soon after the
    return — 2 days keep a quarter of all faults off big runs at 0.7 % of node-days, where 3 days
    already cost ~1 %."""

    hold_s: float = 2 * 86400.0
    max_run_nodes: int = 8


def on_probation(returned_at: Mapping[str, float], now: float, settings: ProbationSettings) -> set[str]:
    """The nodes still on probation at ``now``, from when each came back into service."""
    return {node for node, at in returned_at.items() if at <= now < at + settings.hold_s}


def kept_out_of(run_nodes: int, returned_at: Mapping[str, float], now: float, settings: ProbationSettings) -> set[str]:
    """The nodes a run of ``run_nodes`` nodes must not be placed on (nor take as a spare)."""
    if run_nodes <= settings.max_run_nodes:
        return set()
    return on_probation(returned_at, now, settings)
