"""Probation against today's quarantine on the public InfiniteHBD fault trace (docs/fault-trace.md).

``python bench/fault_trace.py``: a table, then as its last line one JSON object: ``avoided_share``
and ``cost_share`` for the new default (2-day probation) and today's quarantine (2 faults in 7 days)
beside it. Shares: faults avoided of all node faults; node-days held out while healthy of the
fleet's node-days (400 servers, the trace's README, over the trace's span).
"""

from __future__ import annotations

import json
from pathlib import Path

from supervisor.domain.health.quarantine import ProbationSettings
from supervisor.sim.faults import fault_trace
from supervisor.sim.faults.probation_replay import judge_probation
from supervisor.sim.faults.quarantine_replay import judge

TRACE = Path(__file__).parent / "data" / "infinitehbd-faults.csv"
FLEET_NODES = 400
DAY_S = 86400.0


def main() -> None:
    trace = fault_trace.load(TRACE)
    horizon = trace.span_s + 1.0
    fleet_days = FLEET_NODES * horizon / DAY_S
    today = judge(trace, horizon)
    rows = [("quarantine 2 in 7 d (today)", today.faults_avoided, today.node_days_held_out_healthy)]
    for days in (1, 2, 3, 5, 7):
        p = judge_probation(trace, horizon, ProbationSettings(hold_s=days * DAY_S))
        rows.append(
            (
                f"probation {days} d" + (" (new default)" if days == 2 else ""),
                p.faults_avoided,
                p.node_days_held_out_healthy,
            )
        )
    print(f"{'policy':32} {'avoided':>8} {'share':>7} {'node-days':>10} {'share':>7}")
    for name, avoided, cost in rows:
        print(f"{name:32} {avoided:8d} {avoided / today.node_faults:7.1%} {cost:10.1f} {cost / fleet_days:7.2%}")
    new = rows[2]
    print(
        json.dumps(
            {
                "trace": "InfiniteHBD (stepfun-ai/InfiniteHBD-Trace)",
                "node_faults": today.node_faults,
                "avoided_share": round(new[1] / today.node_faults, 4),
                "cost_share": round(new[2] / fleet_days, 4),
                "avoided_share_today": round(today.faults_avoided / today.node_faults, 4),
                "cost_share_today": round(today.node_days_held_out_healthy / fleet_days, 4),
            }
        )
    )


if __name__ == "__main__":
    main()
