"""``slurm-supervisor store migrate`` and the daemon's store on a real PostgreSQL: the password
read from its file or the systemd credential reaches the server and no output or log line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from click.testing import CliRunner
from structlog.testing import capture_logs

from supervisor.adapters.postgres import PostgresStore
from supervisor.adapters.postgres.schema import SCHEMA_VERSION
from supervisor.cli import main, wiring
from supervisor.config import load_daemon_config
from supervisor.testing.kit.specs import spec

pytestmark = pytest.mark.postgres


def _config(tmp_path: Path, url: str, password: str) -> Path:
    path = tmp_path / "supervisor.toml"
    path.write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n[logging]\nlevel = "debug"\nformat = "json"\n'
        f'[store]\nurl = "{url}"\n{password}\n'
    )
    return path


def test_store_migrate_migrates_a_new_database_once(postgres, tmp_path):
    config = _config(tmp_path, postgres.url, f'password_file = "{postgres.password_file}"')
    runner = CliRunner()
    first = runner.invoke(main, ["--config", str(config), "store", "migrate"])
    again = runner.invoke(main, ["--config", str(config), "store", "migrate"])
    assert first.exit_code == 0 and again.exit_code == 0, first.output + again.output
    assert f"{postgres.url}: schema version {SCHEMA_VERSION} (was 0)" in first.output
    assert "already current" in again.output


def test_the_password_appears_in_no_output_and_no_log_line(postgres, tmp_path, caplog, capfd, monkeypatch):
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "pg").write_text(postgres.password)
    (credentials / "pg").chmod(0o400)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))  # as systemd's LoadCredential= sets it
    config = _config(tmp_path, postgres.url, 'password_credential = "pg"')
    caplog.set_level(logging.DEBUG)  # psycopg's own loggers too
    with capture_logs() as events:
        runner = CliRunner()
        done = runner.invoke(main, ["--config", str(config), "store", "migrate"])
        opened = wiring.store(load_daemon_config(config))
        assert isinstance(opened, PostgresStore) and opened.instance_id
        opened.close()
        (credentials / "pg").chmod(0o600)
        (credentials / "pg").write_text("wrong-" + postgres.password)
        refused = runner.invoke(main, ["--config", str(config), "store", "migrate"])
    assert done.exit_code == 0, done.output
    assert refused.exit_code != 0 and "password authentication failed" in refused.output
    seen = [done.output, refused.output, caplog.text, *(repr(e) for e in events), *capfd.readouterr()]
    assert any("store_opened" in text and postgres.url in text for text in seen)  # the log was read
    assert all(postgres.password not in text for text in seen)


def test_with_no_daemon_the_cli_reads_the_postgresql_store_and_names_the_leader(postgres, tmp_path):
    """Offline reads (no daemon answers on this login node) go to the shared database, read-only,
    not to a SQLite file in the state directory that a PostgreSQL instance never writes."""
    config = _config(tmp_path, postgres.url, f'password_file = "{postgres.password_file}"')
    store = wiring.store(load_daemon_config(config))
    store.add_run(spec(name="llm"), 1.0)
    store.claim_lease("login2:4242:ab", "http://login2:8471", 15.0)
    store.close()
    done = CliRunner().invoke(main, ["--config", str(config), "status"])
    assert done.exit_code == 0, done.output
    assert "llm" in done.stdout and "registered" in done.stdout
    assert "leader: login2:4242:ab at http://login2:8471, epoch 1" in done.stdout
    assert not (tmp_path / "state" / "supervisor.db").exists()
