"""Registering a run: the one place a run enters the store, with its REGISTERED logbook line.

Who registers differs (a person through the local API, the simulator, the demo) and says so in the
message and the actor; what is written does not: the run and its first event in one transaction, so a
crash leaves either both or neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from supervisor.domain.records import Event, EventKind
from supervisor.domain.run import RunSpec
from supervisor.ports import Logbook, RunStore


class RunRegistry(RunStore, Logbook, Protocol):
    """What registering writes to: the runs and the logbook."""


def register_run(
    store: RunRegistry,
    spec: RunSpec,
    now: float,
    *,
    actor: str,
    message: str,
    owner_uid: int | None = None,
    evidence: Mapping[str, Any] | None = None,
) -> None:
    """Add ``spec`` as a new run (``owner_uid``: who asked; None: the instance's account) and log
    its registration. Raises the store's ``PermanentError`` for a name already taken."""
    with store.transaction():
        store.add_run(spec, now, owner_uid=owner_uid)
        store.record_event(
            Event(
                spec.name,
                EventKind.REGISTERED,
                message,
                f"{spec.name}:registered:{now:.6f}",
                now,
                actor=actor,
                evidence=dict(evidence or {}),
            )
        )
