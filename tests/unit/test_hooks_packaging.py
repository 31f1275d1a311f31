"""`pip install` gives working Slurm hooks: the wheel built from this tree carries the console
scripts slurm.conf names (`slurm-supervisor-prolog`, `-epilog`, `-healthcheck`), and the prolog
installed that way runs as Slurm runs it (no arguments, config from slurmd's environment).

The wheel is built from a copy of the tree (nothing is written into the working tree) and installed
without dependencies into a fresh virtual environment; the dependencies come from the environment
running the tests through a .pth line, and the installed copy is what runs, not the checkout. The
build is offline (no index, no build isolation) when this environment can build wheels (the
`wheel` package, or setuptools >= 70.1 which carries bdist_wheel); otherwise pip builds in
isolation and fetches the build backend named in pyproject.toml, as `pip install` does at a site.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds a wheel and a virtual environment

REPO = Path(__file__).resolve().parents[2]
HOOKS = ("prolog", "epilog", "healthcheck")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin/ folder of a virtual environment with this tree's wheel installed."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "supervisor", src / "supervisor", ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.strip()
    # the dependencies (and setuptools, the build backend) from the environment running the tests
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(site, "test-deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    offline = ["--no-index", "--no-build-isolation"] if _builds_wheels_offline() else []
    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check"]
    subprocess.run([*pip, "install", "-q", "--no-deps", *offline, str(src)], check=True, timeout=240, env=_env())
    return venv / "bin"


def _builds_wheels_offline() -> bool:
    if importlib.util.find_spec("wheel") is not None:
        return True
    major, minor = (int(x) for x in importlib.metadata.version("setuptools").split(".")[:2])
    return (major, minor) >= (70, 1)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SLURM"))}
    return {**env, **extra}


def _run(script: Path, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(script), *args], cwd=cwd, env=_env(**env), capture_output=True, text=True, timeout=60)


def _last_json(stderr: str) -> dict:
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert lines, stderr
    return lines[-1]


@pytest.mark.parametrize("kind", HOOKS)
def test_the_wheel_installs_each_hook_as_an_executable_bound_to_its_environment(installed, kind, tmp_path):
    script = installed / f"slurm-supervisor-{kind}"
    assert os.access(script, os.X_OK), f"{script} missing or not executable"
    assert script.read_text().splitlines()[0] == f"#!{installed / 'python'}"
    done = _run(script, "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"Usage: slurm-supervisor-{kind} [OPTIONS]" in done.stdout


def test_the_installed_prolog_runs_the_installed_package_not_the_checkout(installed, tmp_path):
    probe = installed / "python"
    where = subprocess.run(
        [str(probe), "-c", "import supervisor.cli.node.hooks as h; print(h.__file__)"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(installed.parent), where


def test_a_broken_hooks_config_is_logged_and_the_prolog_succeeds(installed, tmp_path):
    """docs/hooks.md: a bad config is one JSON line in slurmd's log, and the hook succeeds."""
    bad = tmp_path / "hooks.toml"
    bad.write_text("[hooks]\nnvml_timeout_s = -1\n")
    done = _run(installed / "slurm-supervisor-prolog", cwd=tmp_path, SLURM_SUPERVISOR_HOOKS_CONFIG=str(bad))
    assert done.returncode == 0, done.stderr
    out = _last_json(done.stderr)
    assert out["event"] == "hook_prolog" and "nvml_timeout_s" in out["error"], out


def test_the_installed_prolog_reads_the_gpus_and_spools_its_report(installed, tmp_path):
    """With a valid config and no daemon: the NVML look runs (a host without NVML is not a fault)
    and the report is spooled for the next hook to send."""
    spool = tmp_path / "spool"
    config = tmp_path / "hooks.toml"
    config.write_text(f'[hooks]\nspool_dir = "{spool}"\nnvml_timeout_s = 5\n')
    done = _run(
        installed / "slurm-supervisor-prolog",
        cwd=tmp_path,
        SLURM_SUPERVISOR_HOOKS_CONFIG=str(config),
        SLURMD_NODENAME="gpu017",
        SLURM_JOB_ID="4242",
    )
    out = _last_json(done.stderr)
    assert "error" not in out, out
    assert out["event"] == "hook_prolog" and out["node"] == "gpu017", out
    assert done.returncode == out["exit_code"], (done.returncode, out)
    assert out["spooled"] == 1 and len(list(spool.glob("*.json"))) == 1, out
