"""The store in SQLite; see ``store``."""

from supervisor.adapters.sqlite.base import DB_NAME
from supervisor.adapters.sqlite.store import SqliteStore

__all__ = ["DB_NAME", "SqliteStore"]
