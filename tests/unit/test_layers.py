"""The layer rules of docs/architecture.md, checked by import-linter on every test run."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # mypy and import-linter over the whole package

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert lint, "import-linter is not installed: pip install -e '.[test]'"
    done = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    # layers, no I/O, telemetry alone, the domain's floors and families, presentation apart, the adapters' families,
    # the engine's, the simulator's, the CLI's and the test support's rooms
    assert "Contracts: 14 kept, 0 broken" in done.stdout


def test_the_package_type_checks():
    mypy = shutil.which("mypy", path=str(Path(sys.executable).parent)) or shutil.which("mypy")
    assert mypy, "mypy is not installed: pip install -e '.[test]'"
    done = subprocess.run([mypy, "--no-incremental"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
