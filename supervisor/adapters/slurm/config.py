"""Slurm's running configuration, as ``scontrol show config`` prints it: an argv builder and a
pure parser, read once at the daemon's start for the settings its decisions depend on.

``KillWait`` bounds how long a process Slurm is killing on a responding node can outlive the kill
(SIGTERM, then SIGKILL after KillWait): a restart need not wait for Slurm to finish completing a
job on such a node longer than that. ``AccountingStorageType`` says whether ``sacct`` can answer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

DEFAULT_KILL_WAIT_S = 30.0  # Slurm's own default (slurm.conf(5), KillWait)
_LINE = re.compile(r"^(\w+)\s*=\s?(.*)$")
_SECONDS = re.compile(r"^(\d+)\s*(sec)?$")


def show_config_argv() -> list[str]:
    return ["scontrol", "show", "config"]


def parse_show_config(text: str) -> dict[str, str]:
    """``Key = value`` lines into a mapping (the header and blank lines skipped)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m is not None:
            out[m.group(1)] = m.group(2).strip()
    return out


def kill_wait_s(config: Mapping[str, str]) -> float:
    """KillWait in seconds ("30 sec"); Slurm's default when absent or unreadable."""
    m = _SECONDS.match(config.get("KillWait", ""))
    return float(m.group(1)) if m else DEFAULT_KILL_WAIT_S


def has_accounting(config: Mapping[str, str]) -> bool:
    """A slurmdbd (or another accounting store) is configured, so ``sacct`` knows ended jobs."""
    kind = config.get("AccountingStorageType", "accounting_storage/none")
    return kind not in ("", "accounting_storage/none", "(null)")
