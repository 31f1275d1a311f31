"""The supervisor's memory in SQLite (WAL): one class over the tables, each family in its module.

Runs and attempts (``runs``), the intent journal (``journal``), the logbook for people
(``logbook``), node memory (``nodes``), the checkpoint ledger (``checkpoints``), rollbacks
(``rollbacks``), the progress series (``progress``), in-allocation steps (``alloc_steps``), the leader lease (``lease``;
every write fenced by its epoch: ``fence``).
"""

from __future__ import annotations

from supervisor.adapters.sqlite.alloc_steps import SqliteAllocSteps
from supervisor.adapters.sqlite.base import DB_NAME, SqliteBase
from supervisor.adapters.sqlite.checkpoints import SqliteCheckpoints
from supervisor.adapters.sqlite.journal import SqliteJournal
from supervisor.adapters.sqlite.lease import SqliteLease
from supervisor.adapters.sqlite.logbook import SqliteLogbook
from supervisor.adapters.sqlite.node_care import SqliteNodeCare
from supervisor.adapters.sqlite.nodes import SqliteNodes
from supervisor.adapters.sqlite.progress import SqliteProgress
from supervisor.adapters.sqlite.rollbacks import SqliteRollbacks
from supervisor.adapters.sqlite.runs import SqliteRuns

__all__ = ["DB_NAME", "SqliteStore"]


class SqliteStore(
    SqliteRuns,
    SqliteJournal,
    SqliteLogbook,
    SqliteNodes,
    SqliteNodeCare,
    SqliteCheckpoints,
    SqliteRollbacks,
    SqliteProgress,
    SqliteAllocSteps,
    SqliteLease,
    SqliteBase,
):
    """Implements every store port (supervisor.ports) on one SQLite database."""
