"""The store in PostgreSQL, shared by an instance's login nodes; see ``store``."""

from supervisor.adapters.postgres.base import StoreUnreachable, migrate_database, safe_url
from supervisor.adapters.postgres.store import PostgresStore

__all__ = ["PostgresStore", "StoreUnreachable", "migrate_database", "safe_url"]
