"""Values the store keeps as JSON text and the engine reads back every tick, decoded once per text.

A 2,048-node attempt's node list, a resume plan with its 64 fallbacks: rows written once and read
back at every tick (a run's recent attempts) or every restart (the plans the newest attempts were
handed). What comes back is immutable (tuples, frozen dataclasses), so one decoding can be handed
out again; a changed row is a new text, decoded anew.
"""

from __future__ import annotations

import json
from functools import lru_cache

from supervisor.domain.checkpoints.resume import ResumePlan


@lru_cache(maxsize=512)
def names(text: str | None) -> tuple[str, ...]:
    """A stored list of node names (None or empty: none)."""
    return tuple(json.loads(text or "[]"))


@lru_cache(maxsize=256)
def resume_plan(text: str) -> ResumePlan:
    """A stored resume plan (``ResumePlan.to_json``'s text)."""
    return ResumePlan.from_json(json.loads(text))
