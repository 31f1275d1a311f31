"""Each node's place on the remediation ladder (``node_care``): read every tick, written when a
node moves; a restarted daemon resumes every ladder where it stood."""

from __future__ import annotations

from supervisor.adapters.node_care_rows import from_row, to_row
from supervisor.adapters.sqlite.base import SqliteBase
from supervisor.domain.health.ladder import NodeCare

_KEEP = (
    "INSERT INTO node_care(node, rung, since, cause, rule, failures, boot_before, until, evidence, updated_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(node) DO UPDATE SET rung = excluded.rung,"
    " since = excluded.since, cause = excluded.cause, rule = excluded.rule, failures = excluded.failures,"
    " boot_before = excluded.boot_before, until = excluded.until, evidence = excluded.evidence,"
    " updated_at = excluded.updated_at"
)
_READ = (
    "SELECT node, rung, since, cause, rule, failures, boot_before, until, evidence, updated_at"
    " FROM node_care ORDER BY node"
)


class SqliteNodeCare(SqliteBase):
    def keep_node_care(self, care: NodeCare, now: float) -> None:
        with self.transaction() as db:
            db.execute(_KEEP, to_row(care, now))

    def drop_node_care(self, node: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM node_care WHERE node = ?", (node,))

    def node_cares(self) -> dict[str, NodeCare]:
        rows = self._db.execute(_READ).fetchall()
        return {r["node"]: from_row(r) for r in rows}
