"""Plain-text and JSON renderings of runs, attempts, nodes and the logbook for the CLI."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from supervisor.domain.records import AttemptRecord, Event, NodeVerdict, RunRecord


def ts(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def run_dict(run: RunRecord, attempts: list[AttemptRecord]) -> dict[str, Any]:
    a = run.attempt
    return {
        "name": run.name,
        "state": run.state.value,
        "partition": run.spec.partition,
        "nodes": run.spec.nodes,
        "restarts": {"spent": run.restarts_spent, "limit": run.spec.max_restarts},
        "job_id": a.job_id if a else None,
        "attempt": a.seq if a else None,
        "running_on": list(a.nodes) if a and a.started_at and not a.ended_at else [],
        "excluded": dict(run.excluded),
        "end_reason": run.end_reason,
        "attempts": [
            {"seq": x.seq, "job_id": x.job_id, "restart_count": x.restart_count, "nodes": list(x.nodes),
             "submitted_at": x.submitted_at, "started_at": x.started_at, "ended_at": x.ended_at,
             "end_state": x.end_state, "end_reason": x.end_reason, "exit_code": x.exit_code}
            for x in attempts
        ],
    }


def status_lines(runs: Iterable[RunRecord]) -> list[str]:
    rows = [("RUN", "STATE", "JOB", "ATTEMPT", "RESTARTS", "EXCLUDED")]
    for r in runs:
        a = r.attempt
        rows.append((r.name, r.state.value, str(a.job_id) if a else "-", str(a.seq) if a else "-",
                     f"{r.restarts_spent}/{r.spec.max_restarts}", ",".join(sorted(r.excluded)) or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def logbook_lines(events: Iterable[Event], *, evidence: bool = False) -> list[str]:
    out = []
    for e in events:
        where = f"attempt {e.attempt}" if e.attempt is not None else "-"
        out.append(f"{ts(e.at)}  {e.run}  {where:<10} {e.kind.value:<14} {e.message}  [{e.actor}]")
        if evidence and e.evidence:
            out.append("    evidence: " + json.dumps(e.evidence, sort_keys=True, default=str))
    return out


def node_lines(verdicts: Iterable[NodeVerdict]) -> list[str]:
    rows = [("NODE", "VERDICT", "ACTION", "RUN", "SINCE", "REASON")]
    for v in verdicts:
        rows.append((v.node, v.verdict.value, v.action or "excluded", v.run or "-", ts(v.at), v.reason))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([*(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)), row[-1]]) for row in rows]
