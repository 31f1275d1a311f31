"""scripts/figures: the package's shape, a table and its figures as the last line's JSON."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_last_line_holds_the_figures_of_this_checkout():
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "figures"), "--widest", "3"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    *table, last = done.stdout.splitlines()
    figures = json.loads(last)
    assert figures["import_contracts"] == (ROOT / "pyproject.toml").read_text().count("[[tool.importlinter.contracts]]")
    assert figures["modules"] == sum(1 for p in (ROOT / "supervisor").rglob("*.py") if p.name != "__init__.py")
    assert figures["module_median_lines"] <= figures["module_max_lines"]
    assert figures["function_p90_lines"] <= figures["function_max_lines"]
    assert sum(line.startswith("  supervisor/") for line in table) == 3
