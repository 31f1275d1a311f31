"""Command output is for people and scripts: results on stdout, logs on stderr at the configured
``[logging] level`` (the CLI configures logging from the instance's configuration)."""

import subprocess
import sys
from pathlib import Path

from supervisor.api.testing import local_api

# A command that logs as library code would (structlog, before and after the configuration is
# read), then prints its result: the shape of every command that reaches the daemon or Slurm.
_PROBE = """
import click, structlog
from supervisor.cli import context, main

@main.command("probe")
@click.pass_context
def probe(ctx):
    log = structlog.get_logger("probe")
    context.config(ctx)
    log.debug("probe_debug_line")
    log.warning("probe_warning_line")
    click.echo("RESULT")

main(["--config", {config!r}, "probe"])
"""


def _config(tmp_path: Path, level: str) -> Path:
    cfg = tmp_path / "supervisor.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n[logging]\nlevel = "{level}"\n')
    return cfg


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_logs_go_to_stderr_at_the_configured_level(tmp_path):
    for level, shown in (("warning", ["probe_warning_line"]), ("debug", ["probe_debug_line", "probe_warning_line"])):
        done = _run([sys.executable, "-c", _PROBE.format(config=str(_config(tmp_path, level)))])
        assert done.returncode == 0, done.stderr
        assert done.stdout == "RESULT\n", done.stdout
        assert [w for w in ("probe_debug_line", "probe_warning_line") if w in done.stderr] == shown, done.stderr


def test_submit_prints_only_its_result_on_stdout(tmp_path):
    (tmp_path / "train.sbatch").write_text("#!/bin/bash\nsrun true\n")
    spec = tmp_path / "run.toml"
    spec.write_text('[run]\nname = "llm"\nscript = "train.sbatch"\npartition = "main"\nnodes = 2\n')
    cli = [sys.executable, "-m", "supervisor", "--config", str(_config(tmp_path, "debug"))]
    with local_api(tmp_path / "state"):
        done = _run([*cli, "submit", "--no-slurm-check", str(spec)])
    assert done.returncode == 0, done.stderr
    assert done.stdout == "run llm registered; the daemon submits it on its next tick\n"


def test_shell_completion_is_offered():
    env = {"COMP_WORDS": "slurm-supervisor lo", "COMP_CWORD": "1", "_SLURM_SUPERVISOR_COMPLETE": "bash_complete"}
    script = Path(sys.executable).parent / "slurm-supervisor"  # the name click derives the variable from
    done = subprocess.run([str(script)], capture_output=True, text=True, timeout=60, check=False, env=env)
    assert "logbook" in done.stdout, done.stdout + done.stderr
