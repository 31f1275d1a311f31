"""The CLI loads a command's module when the command runs: `status` (which the tests and operators
run often) does not pay for the daemon, the simulator and numpy at every start."""

import subprocess
import sys

import click

from supervisor.cli import COMMANDS, main


def test_every_command_loads_under_its_own_name():
    ctx = click.Context(main)
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        assert command is not None and command.name == name, name
    assert main.get_command(ctx, "no-such-command") is None
    assert len(COMMANDS) == 18  # stacks is the 18th


def test_starting_the_cli_imports_no_command_module():
    probe = (
        "import sys; import supervisor.cli; "
        "print(sorted(m for m in sys.modules if m == 'numpy' or m.startswith(('supervisor.sim', 'supervisor.engine'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
