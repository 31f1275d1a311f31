"""The install paths the docs give agree with each other and with what the package ships: the
slurm.conf lines of docs/hooks.md name console scripts pyproject.toml declares, inside the virtual
environment docs/operations.md creates, and hooks/' wrappers default to that environment's Python."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV = "/opt/slurm-supervisor"  # what docs/operations.md installs into


def _scripts() -> dict[str, str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def test_operations_installs_into_the_venv_the_other_docs_name():
    install = (REPO / "docs/operations.md").read_text()
    assert f"python3 -m venv {VENV} && {VENV}/bin/pip install slurm-supervisor" in install


def test_the_slurm_conf_lines_name_declared_console_scripts_of_that_venv():
    hooks = (REPO / "docs/hooks.md").read_text()
    lines = dict(re.findall(r"^(Prolog|Epilog|HealthCheckProgram)=(\S+)$", hooks, re.MULTILINE))
    assert set(lines) == {"Prolog", "Epilog", "HealthCheckProgram"}, lines
    scripts = _scripts()
    for path in lines.values():
        folder, name = path.rsplit("/", 1)
        assert folder == f"{VENV}/bin" and name in scripts, path
        assert scripts[name].startswith("supervisor.cli.node.hooks:"), scripts[name]


def test_the_agent_line_of_the_docs_uses_that_venv():
    agent = (REPO / "docs/node-agent.md").read_text()
    assert f"srun --overlap --ntasks-per-node=1 {VENV}/bin/slurm-supervisor agent &" in agent


def test_the_checkout_wrappers_default_to_that_venvs_python():
    for kind in ("prolog", "epilog", "healthcheck"):
        text = (REPO / "hooks" / kind).read_text()
        assert f'"${{SLURM_SUPERVISOR_PYTHON:-{VENV}/bin/python}}" -P -m supervisor hook {kind}' in text, kind
        assert "\ncd /\n" in text, kind  # run as root: never from the working directory slurmd left
