"""Headless Chromium (Debian's ``chromium`` package) for page tests.

Missing Chromium skips these tests, except under ``CI=true``, where it fails: install it with
``apt-get install -y --no-install-recommends chromium``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


@dataclass(frozen=True)
class Loaded:
    dom: str
    console: list[str]  # every console message the page produced (Chromium logs them all at INFO:CONSOLE)
    stderr: str


class Chromium:
    def __init__(self, binary: str, profiles: Path) -> None:
        self.binary, self.profiles, self.n = binary, profiles, 0

    def _argv(self, *extra: str) -> list[str]:
        self.n += 1
        profile = self.profiles / f"profile-{self.n}"  # a fresh --user-data-dir per start
        return [self.binary, *FLAGS, f"--user-data-dir={profile}", *extra]

    def load(self, page: Path) -> Loaded:
        """Load the page, run its scripts, return the DOM afterwards and the console messages."""
        done = subprocess.run(
            self._argv(
                "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", "--dump-dom", page.resolve().as_uri()
            ),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
        return Loaded(done.stdout, console, done.stderr)

    def screenshot(self, page: Path, out: Path, width: int = 1200, height: int = 1600) -> Path:
        done = subprocess.run(
            self._argv(f"--window-size={width},{height}", f"--screenshot={out}", page.resolve().as_uri()),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0 and out.exists(), done.stderr[-2000:]
        return out


@pytest.fixture(scope="session")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Chromium:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        reason = "Debian's chromium is not installed (apt-get install -y --no-install-recommends chromium)"
        if os.environ.get("CI", "").strip().lower() == "true":
            pytest.fail(f"headless Chromium is required under CI=true: {reason}", pytrace=False)
        pytest.skip(reason)
    return Chromium(binary, tmp_path_factory.mktemp("chromium"))
