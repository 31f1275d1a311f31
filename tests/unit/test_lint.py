"""ruff's lint rules and formatting (configured in pyproject.toml), checked on every test run."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = ["supervisor", "tests", "bench", "hooks"]


def _ruff() -> str:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is not installed: pip install -e '.[test]'"
    return ruff


def test_ruff_lint_is_clean():
    done = subprocess.run([_ruff(), "check", *TREES], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_is_clean():
    done = subprocess.run([_ruff(), "format", "--check", *TREES], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, "run `ruff format " + " ".join(TREES) + "`\n" + done.stdout + done.stderr
