"""One instance per account (issue 13 item 1): where each instance's socket and state live, how the
CLI finds the instance to ask, that the state directory is the daemon's alone, and that without a
node guard an instance changes no node."""

from __future__ import annotations

import os
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from supervisor.cli import main
from supervisor.cli.service.daemon import _own_state_dir
from supervisor.cli.wiring import engine_settings
from supervisor.config import load_daemon_config
from supervisor.config.daemon_file import ApiSection


@pytest.mark.parametrize(
    ("state_dir", "socket"),
    [
        ("/var/lib/slurm-supervisor/alice", "/run/slurm-supervisor/alice/api.sock"),  # the template unit's dirs
        ("/var/lib/slurm-supervisor", "/run/slurm-supervisor/api.sock"),  # the single-user layout
        ("/home/bo/.local/state/slurm-supervisor", "/home/bo/.local/state/slurm-supervisor/api.sock"),  # --user
    ],
)
def test_each_instances_socket_follows_its_state_directory(state_dir: str, socket: str) -> None:
    assert ApiSection().socket_path(Path(state_dir)) == Path(socket)


def test_a_configured_socket_wins_and_is_taken_from_the_files_folder(tmp_path: Path) -> None:
    path = tmp_path / "alice.toml"
    path.write_text('[daemon]\nstate_dir = "/var/lib/slurm-supervisor/alice"\n[api]\nsocket = "run/api.sock"\n')
    cfg = load_daemon_config(path)
    assert cfg.api.socket_path(cfg.daemon.state_dir) == tmp_path / "run" / "api.sock"


@pytest.mark.parametrize(
    ("text", "changes"),
    [
        ("", False),  # no guard: the instance's account holds no node rights, so it changes no node
        ('[guard]\nsocket = "/run/slurm-supervisor-guard.sock"\n', True),
        ("[daemon]\nmay_change_nodes = true\n", True),  # an account that holds node rights itself
        ('[daemon]\nmay_change_nodes = false\n[guard]\nsocket = "/run/g.sock"\n', False),
    ],
)
def test_without_a_guard_an_instance_changes_no_node(tmp_path: Path, text: str, changes: bool) -> None:
    path = tmp_path / "supervisor.toml"
    path.write_text(text)
    assert engine_settings(load_daemon_config(path)).may_change_nodes is changes


def test_instance_names_the_accounts_configuration() -> None:
    result = CliRunner().invoke(main, ["--instance", "ssv-no-such-account", "status"])
    assert result.exit_code == 1 and "/etc/slurm-supervisor/ssv-no-such-account.toml" in result.output
    bad = CliRunner().invoke(main, ["--instance", "../shadow", "status"])
    assert bad.exit_code == 2 and "not an instance name" in bad.output


def test_your_own_instance_is_found_without_options(tmp_path: Path) -> None:
    own = tmp_path / "xdg" / "slurm-supervisor"
    own.mkdir(parents=True)
    (own / "supervisor.toml").write_text(f'[api]\nsocket = "{tmp_path / "mine.sock"}"\n')
    result = CliRunner().invoke(main, ["cancel", "llm"], env={"XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert result.exit_code == 1 and f"no slurm-supervisor daemon answers at {tmp_path / 'mine.sock'}" in result.output
    assert "Fix: start the instance" in result.output


def test_the_state_directory_is_made_the_daemons_alone(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    _own_state_dir(state)
    assert state.stat().st_mode & 0o777 == 0o700
    _own_state_dir(tmp_path / "new" / "state")
    assert (tmp_path / "new" / "state").stat().st_mode & 0o777 == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another account needs root")
def test_a_state_directory_of_another_account_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    os.chown(state, 65534, 65534)
    with pytest.raises(click.ClickException, match="belongs to uid 65534, not to this instance's account"):
        _own_state_dir(state)
