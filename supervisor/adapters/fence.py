"""A site's fence command (e.g. power a dead node off through its BMC), run as an argv list."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

import structlog

from supervisor.ports import PermanentError, TransientError

log = structlog.get_logger("supervisor.fence")


class CommandFencer:
    def __init__(self, argv_template: Sequence[str], timeout: float = 60.0) -> None:
        if not argv_template:
            raise ValueError("fence command is empty")
        self.template = tuple(argv_template)
        self.timeout = timeout

    def argv(self, node: str) -> list[str]:
        return [part.replace("{node}", node) for part in self.template]

    def fence(self, node: str) -> None:
        argv = self.argv(node)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise TransientError(f"fence command timed out after {self.timeout:.0f} s: {argv}", delay=5.0) from exc
        except OSError as exc:
            raise PermanentError(f"fence command could not start: {exc}") from exc
        log.info("fenced", node=node, argv=argv, rc=done.returncode)
        if done.returncode != 0:
            raise TransientError(f"fence command exited {done.returncode}: {done.stderr.strip()[:200]}", delay=5.0)
