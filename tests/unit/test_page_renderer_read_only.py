"""The page renderer's child holds the store read-only: it never migrates or writes it, and a store
whose schema it does not know gets a clear 503, not a migration (least privilege)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from supervisor.adapters.sqlite import DB_NAME, SqliteStore
from supervisor.adapters.sqlite.schema import MIGRATIONS, SCHEMA_VERSION, _statements
from supervisor.adapters.web.renderer import ProcessRenderer
from supervisor.domain.run import RunSpec
from supervisor.testing.kit.specs import spec


def _spec() -> RunSpec:
    return spec(script="/x.sbatch", partition="gpu")


def _store_at_version(state_dir: Path, version: int) -> Path:
    """A database as an older (or newer) slurm-supervisor left it, in WAL as the daemon keeps it."""
    state_dir.mkdir(exist_ok=True)
    path = state_dir / DB_NAME
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    for statement in [s for script in MIGRATIONS[: min(version, SCHEMA_VERSION)] for s in _statements(script)]:
        db.execute(statement)
    db.execute(f"PRAGMA user_version = {version}")
    db.close()  # the last close checkpoints the WAL into the file: its bytes are the whole store
    return path


def _access_modes(pid: int, path: Path) -> list[int]:
    """O_RDONLY / O_WRONLY / O_RDWR of every descriptor process ``pid`` holds on ``path``."""
    modes = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != str(path):
                continue
            flags = Path(f"/proc/{pid}/fdinfo/{fd}").read_text().split("flags:")[1].split()[0]
        except OSError:  # closed meanwhile
            continue
        modes.append(int(flags, 8) & os.O_ACCMODE)
    return modes


def test_the_renderer_child_opens_the_store_read_only(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path)  # the daemon's store, open (and writable) as it renders
    store.add_run(_spec(), 1000.0)
    renderer = ProcessRenderer(tmp_path)
    try:
        status, _, text = renderer.metrics()
        assert status == 200 and b'slurm_supervisor_runs{state="registered"} 1.0' in text
        assert renderer.pid is not None
        assert _access_modes(renderer.pid, (tmp_path / DB_NAME).resolve()) == [os.O_RDONLY]
        store.add_run(spec(name="two", script="/x.sbatch", partition="gpu", nodes=1), 1001.0)
        status, _, text = renderer.metrics()  # it reads what the daemon writes meanwhile
        assert status == 200 and b'slurm_supervisor_runs{state="registered"} 2.0' in text
    finally:
        renderer.close()
        store.close()


@pytest.mark.parametrize("version", [SCHEMA_VERSION - 1, SCHEMA_VERSION + 1], ids=["older", "newer"])
def test_a_store_of_another_schema_is_left_untouched_and_the_page_says_why(tmp_path: Path, version: int) -> None:
    path = _store_at_version(tmp_path, version)
    before = path.read_bytes()
    renderer = ProcessRenderer(tmp_path)
    try:
        status, _, body = renderer.metrics()
        assert status == 503
        assert f"schema version {version}".encode() in body and str(SCHEMA_VERSION).encode() in body
        assert path.read_bytes() == before  # not migrated, not written
        db = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
        assert db.execute("PRAGMA user_version").fetchone()[0] == version
        db.close()
        if version < SCHEMA_VERSION:  # the daemon migrates it: the next page is read again
            SqliteStore(tmp_path).close()
            status, _, _ = renderer.logbook("llm", 2000.0)
            assert status == 404
    finally:
        renderer.close()


def test_a_read_only_store_refuses_writes_and_creates_nothing(tmp_path: Path) -> None:
    from supervisor.adapters.sqlite.schema import SchemaMismatch

    with pytest.raises(sqlite3.OperationalError):
        SqliteStore(tmp_path / "absent", read_only=True)
    assert not (tmp_path / "absent").exists()
    SqliteStore(tmp_path).close()
    reader = SqliteStore(tmp_path, read_only=True)
    try:
        assert reader.runs() == []
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            reader.add_run(_spec(), 1000.0)
    finally:
        reader.close()
    _store_at_version(tmp_path / "old", SCHEMA_VERSION - 1)
    with pytest.raises(SchemaMismatch, match=f"schema version {SCHEMA_VERSION - 1}"):
        SqliteStore(tmp_path / "old", read_only=True)
