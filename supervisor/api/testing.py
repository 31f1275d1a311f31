"""An instance's local API served in this process over a state directory, for tests of the CLI
that need no daemon loop (``with local_api(state_dir): ...``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from supervisor.adapters.clock import SystemClock
from supervisor.adapters.sqlite import SqliteStore
from supervisor.api.access import Instance
from supervisor.api.identity import instance as this_instance
from supervisor.api.ops import Operations, SlurmCheck
from supervisor.api.server import ApiServer


@contextlib.contextmanager
def local_api(
    state_dir: Path,
    *,
    socket: Path | None = None,
    instance: Instance | None = None,
    slurm: SlurmCheck | None = None,
) -> Iterator[ApiServer]:
    """Serve the API at ``socket`` (default STATE_DIR/api.sock, where the CLI looks for it) until
    the block ends. ``instance``: who the daemon is (default: this process's account)."""
    store = SqliteStore(state_dir)
    ops = Operations(store, SystemClock(), instance or this_instance(None, None), slurm)
    server = ApiServer(socket or Path(state_dir) / "api.sock", ops.answer)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        store.close()


SINGLE_USER_SCHEMA = 9  # the last schema of the single-user layout: runs had no owner


def single_user_store(state_dir: Path, run: str = "legacy", state: str = "completed") -> None:
    """A state directory as the single-user daemon left it (schema 9, one run, no owners), made
    with that schema's own migrations, for tests of the upgrade path."""
    import json
    import sqlite3

    from supervisor.adapters.sqlite.schema import MIGRATIONS, _statements
    from supervisor.adapters.store_rows import spec_to_json
    from supervisor.domain.run import RunSpec

    state_dir.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(state_dir / "supervisor.db", isolation_level=None)
    for version, migration in enumerate(MIGRATIONS[:SINGLE_USER_SCHEMA], start=1):
        for statement in _statements(migration):
            db.execute(statement)
        db.execute(f"PRAGMA user_version = {version}")
    spec = RunSpec(name=run, script="/x.sh", partition="main", nodes=2)
    db.execute(
        "INSERT INTO runs(name, spec, state, restarts_spent, created_at, updated_at, cancel_requested, end_reason)"
        " VALUES (?, ?, ?, 1, 1.0, 2.0, 0, NULL)",
        (run, json.dumps(spec_to_json(spec)), state),
    )
    db.close()
