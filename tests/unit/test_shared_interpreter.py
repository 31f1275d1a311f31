"""The interpreter other accounts run in multi-account tests (``testing.slurm.users``): on a host whose
own Python is private (pyenv under /root) and whose system has no Python of this version (Debian
13 ships 3.13), a world-readable copy is made; nobody can run it with this project importable."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from supervisor.testing.slurm.users import python_for_others, shared_interpreter

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="copies into /var/cache and runs as nobody: root only")
NOBODY = 65534


@needs_root
def test_nobody_runs_the_shared_copy_with_the_project_importable() -> None:
    copy = shared_interpreter()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert shared_interpreter() == copy  # made once, then reused
    assert not (copy / "lib" / f"python{version}" / "site-packages").exists()
    env = {"LD_LIBRARY_PATH": str(copy / "lib"), "PYTHONPATH": python_for_others()[1].get("PYTHONPATH", "")}
    done = subprocess.run(
        [str(copy / "bin" / f"python{version}"), "-c", "import sys, supervisor.domain.run; print(sys.version)"],
        env=env, user=NOBODY, group=NOBODY, extra_groups=[], cwd="/", capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(sys.version.split()[0])


@needs_root
def test_the_copy_runs_isolated_too() -> None:
    """``-I`` ignores PYTHON* variables: the copy finds its standard library beside its binary."""
    copy = shared_interpreter()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    done = subprocess.run(
        [str(copy / "bin" / f"python{version}"), "-I", "-c", "import json, ssl, sqlite3, sys; print(sys.prefix)"],
        env={"LD_LIBRARY_PATH": str(copy / "lib")}, user=NOBODY, group=NOBODY, extra_groups=[],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(copy)
