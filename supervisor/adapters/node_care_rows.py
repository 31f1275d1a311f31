"""The ``node_care`` table's rows, one encoding for SQLite and PostgreSQL (the same columns): one
node's place on the remediation ladder (``domain.health.ladder.NodeCare``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from supervisor.domain.health.ladder import NodeCare, Rung


def to_row(care: NodeCare, now: float) -> tuple[Any, ...]:
    """node, rung, since, cause, rule, failures, boot_before, until, evidence, updated_at"""
    evidence = json.dumps(dict(care.evidence), sort_keys=True)
    return (
        care.node,
        care.rung.value,
        care.since,
        care.cause,
        care.rule,
        care.failures,
        care.boot_before,
        care.until,
        evidence,
        now,
    )


def from_row(row: Mapping[str, Any]) -> NodeCare:
    return NodeCare(
        node=row["node"],
        rung=Rung(row["rung"]),
        since=float(row["since"]),
        cause=row["cause"],
        rule=row["rule"],
        failures=int(row["failures"]),
        boot_before=row["boot_before"],
        until=row["until"],
        evidence=json.loads(row["evidence"]),
    )
