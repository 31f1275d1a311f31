"""The probation rule (``domain.health.quarantine.on_probation``) judged on a replayed fault trace.

Every node fault's repair end starts a probation on that node. A later fault of the node that
starts while it is on probation is **avoided** for big runs (they kept it out); the **cost** is the
time on probation while the node was not under repair, in node-days. Shares are against all node
faults and against the fleet's node-days. Pure: the same trace and settings give the same figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from supervisor.domain.health.quarantine import ProbationSettings, on_probation
from supervisor.sim.faults.fault_trace import FaultTrace, TraceFault
from supervisor.sim.faults.quarantine_replay import DAY_S, _length, _merge, _overlap


@dataclass(frozen=True)
class ProbationJudgement:
    node_faults: int
    faults_avoided: int
    node_days_held_out_healthy: float

    def to_json(self) -> dict[str, float | int]:
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in asdict(self).items()}


def judge_probation(trace: FaultTrace, horizon_s: float, settings: ProbationSettings) -> ProbationJudgement:
    by_node: dict[str, list[TraceFault]] = {}
    for f in sorted(trace.faults, key=lambda f: f.start_s):
        if f.start_s < horizon_s and f.cause.shows.node_level:
            by_node.setdefault(f.node, []).append(f)
    avoided, healthy = 0, 0.0
    for faults in by_node.values():
        avoided += _avoided(faults, settings)
        spans = _merge((_end(f), min(horizon_s, _end(f) + settings.hold_s)) for f in faults)
        repairs = _merge((f.start_s, min(horizon_s, _end(f))) for f in faults)
        healthy += _length(spans) - _overlap(spans, repairs)
    return ProbationJudgement(sum(map(len, by_node.values())), avoided, healthy / DAY_S)


def _avoided(faults: Sequence[TraceFault], settings: ProbationSettings) -> int:
    """Faults that struck while the node was on probation since an earlier return."""
    hits = 0
    for i, f in enumerate(faults[1:], 1):
        returns = [_end(p) for p in faults[:i] if _end(p) <= f.start_s]
        if returns:
            hits += f.node in on_probation({f.node: max(returns)}, f.start_s, settings)
    return hits


def _end(f: TraceFault) -> float:
    return f.end_s if f.end_s is not None else f.start_s
