"""Values the store keeps as JSON text and the engine reads back every tick, decoded once per text
(``supervisor.adapters.store_rows``, shared with the PostgreSQL store)."""

from __future__ import annotations

from supervisor.adapters.store_rows import names, resume_plan

__all__ = ["names", "resume_plan"]
