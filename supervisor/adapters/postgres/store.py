"""The supervisor's memory in PostgreSQL: one class over the tables, each family in its module,
as ``adapters.sqlite.store`` composes SQLite's.

Runs and attempts (``runs``), the intent journal (``journal``), the logbook for people
(``logbook``), node memory (``nodes``), the remediation ladder (``node_care``), the checkpoint ledger (``checkpoints``), rollbacks
(``rollbacks``), the progress series (``progress``), in-allocation steps (``alloc_steps``), the leader lease (``lease``; every
write fenced by its epoch in ``base``).
"""

from __future__ import annotations

from supervisor.adapters.postgres.alloc_steps import PostgresAllocSteps
from supervisor.adapters.postgres.base import PostgresBase
from supervisor.adapters.postgres.checkpoints import PostgresCheckpoints
from supervisor.adapters.postgres.journal import PostgresJournal
from supervisor.adapters.postgres.lease import PostgresLease
from supervisor.adapters.postgres.logbook import PostgresLogbook
from supervisor.adapters.postgres.node_care import PostgresNodeCare
from supervisor.adapters.postgres.nodes import PostgresNodes
from supervisor.adapters.postgres.progress import PostgresProgress
from supervisor.adapters.postgres.rollbacks import PostgresRollbacks
from supervisor.adapters.postgres.runs import PostgresRuns

__all__ = ["PostgresStore"]


class PostgresStore(
    PostgresRuns,
    PostgresJournal,
    PostgresLogbook,
    PostgresNodes,
    PostgresNodeCare,
    PostgresCheckpoints,
    PostgresRollbacks,
    PostgresProgress,
    PostgresAllocSteps,
    PostgresLease,
    PostgresBase,
):
    """Implements every store port (supervisor.ports) on one PostgreSQL database."""
