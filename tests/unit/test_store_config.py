"""``[store]``: SQLite stays the default; a PostgreSQL URL never holds the password (refused without
showing it back); the password comes from a file of the daemon's own or a systemd credential."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from supervisor.adapters.sqlite import SqliteStore
from supervisor.adapters.sqlite.schema import SCHEMA_VERSION
from supervisor.cli import main, wiring
from supervisor.config import ConfigError, load_daemon_config

SECRET = "s3cret-Pa55"


def _config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "supervisor.toml"
    path.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n{body}')
    return path


def test_without_a_store_section_the_store_is_sqlite_in_the_state_directory(tmp_path):
    cfg = load_daemon_config(_config(tmp_path, ""))
    assert not cfg.store.postgres
    opened = wiring.store(cfg)
    assert isinstance(opened, SqliteStore) and opened.path.parent == tmp_path / "state"
    opened.close()


@pytest.mark.parametrize(
    "url", [f"postgresql://team:{SECRET}@db1/team", f"postgresql://team@db1/team?password={SECRET}&sslmode=require"]
)
def test_a_url_with_a_password_is_refused_without_showing_it(tmp_path, url):
    with pytest.raises(ConfigError) as refused:
        load_daemon_config(_config(tmp_path, f'[store]\nurl = "{url}"\n'))
    assert "holds a password" in str(refused.value) and "password_file" in str(refused.value)
    assert SECRET not in str(refused.value)


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ('url = "mysql://db1/team"', "not a PostgreSQL URL"),
        ('password_file = "pw"', "no url"),
        ('url = "postgresql://t@db1/t"\npassword_file = "pw"\npassword_credential = "pw"', "both set"),
        ('url = "postgresql://t@db1/t"\npassword_credential = "../etc/shadow"', "not a credential name"),
    ],
)
def test_a_store_section_that_cannot_work_is_refused_with_the_fix(tmp_path, body, said):
    with pytest.raises(ConfigError, match=said):
        load_daemon_config(_config(tmp_path, f"[store]\n{body}\n"))


def test_a_unix_socket_url_is_a_url_with_a_host(tmp_path):
    cfg = load_daemon_config(_config(tmp_path, '[store]\nurl = "postgresql:///team?host=/run/postgresql"\n'))
    assert cfg.store.postgres and wiring.store_password(cfg) is None  # peer authentication: no password


def test_the_password_comes_from_its_file_checked_like_every_secret(tmp_path):
    secret = tmp_path / "store-password"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o644)
    cfg = load_daemon_config(_config(tmp_path, f'[store]\nurl = "postgresql://t@db1/t"\npassword_file = "{secret}"\n'))
    with pytest.raises(click.ClickException, match="chmod 600") as loose:
        wiring.store_password(cfg)
    assert SECRET not in loose.value.message
    secret.chmod(0o600)
    assert wiring.store_password(cfg) == SECRET


def test_the_password_comes_from_the_systemd_credential(tmp_path):
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "store-password").write_text(SECRET)
    (credentials / "store-password").chmod(0o400)  # as systemd hands it to the service
    body = '[store]\nurl = "postgresql://t@db1/t"\npassword_credential = "store-password"\n'
    cfg = load_daemon_config(_config(tmp_path, body))
    assert wiring.store_password(cfg, {"CREDENTIALS_DIRECTORY": str(credentials)}) == SECRET
    with pytest.raises(click.ClickException, match="LoadCredential=store-password"):
        wiring.store_password(cfg, {})


def test_store_migrate_brings_the_sqlite_store_to_this_schema_once(tmp_path):
    config = _config(tmp_path, "")
    runner = CliRunner()
    first = runner.invoke(main, ["--config", str(config), "store", "migrate"])
    again = runner.invoke(main, ["--config", str(config), "store", "migrate"])
    assert first.exit_code == 0 and again.exit_code == 0, first.output + again.output
    assert f"schema version {SCHEMA_VERSION} (was 0)" in first.output
    assert f"schema version {SCHEMA_VERSION}, already current" in again.output
