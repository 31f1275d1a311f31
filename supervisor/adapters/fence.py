"""A site's fence command (e.g. power a dead node off through its BMC), run as an argv list.

The argv may carry a secret (a BMC password), so it is never logged nor put into an error: the
program's name and the node are (issue 32, finding 17). Better still, the command reads its secret
from a file or its environment.
"""

from __future__ import annotations

import os
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

    @property
    def program(self) -> str:
        """What the logs name: the program, never its arguments."""
        return os.path.basename(self.template[0])

    def fence(self, node: str) -> None:
        argv = self.argv(node)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout, check=False)
        except subprocess.TimeoutExpired:  # its text is the argv: not repeated
            raise TransientError(
                f"fence command {self.program} timed out after {self.timeout:.0f} s for {node}", delay=5.0
            ) from None
        except OSError as exc:
            raise PermanentError(f"fence command {self.program} could not start: {exc.strerror or exc}") from None
        log.info("fenced", node=node, program=self.program, rc=done.returncode)
        if done.returncode != 0:
            raise TransientError(f"fence command exited {done.returncode}: {done.stderr.strip()[:200]}", delay=5.0)
