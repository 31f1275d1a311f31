"""Run this project's Python as another local account (``supervisor.testing.slurm.users``), for tests where
the daemon or the CLI must be an ordinary user: its UID, primary group and supplementary groups from
the group database, a plain environment, and an interpreter it may run (``python_for_others``)."""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from supervisor.testing.slurm.users import python_for_others


def as_account(
    name: str, args: Sequence[str], env: Mapping[str, str] | None = None
) -> tuple[list[str], dict[str, Any]]:
    """``(argv, keyword arguments for subprocess.run / Popen)`` that run ``python ARGS`` as ``name``
    (root only). ``env`` is added to the account's plain environment."""
    entry = pwd.getpwnam(name)
    python, python_env = python_for_others()
    path = ":".join(["/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"])
    return [*python, *args], {
        "user": entry.pw_uid,
        "group": entry.pw_gid,
        "extra_groups": os.getgrouplist(name, entry.pw_gid),
        "env": {"HOME": entry.pw_dir, "PATH": path, "LANG": "C.UTF-8", **python_env, **(env or {})},
    }


def python_as(uid: int, script: str, *args: str) -> subprocess.Popen[str]:
    """``python -I -c SCRIPT ARGS`` started as ``uid`` (its group the same number, no others: as
    'nobody' or a daemon account), in the interpreter's plain environment; stdout piped, as text."""
    python, env = python_for_others()
    return subprocess.Popen(
        [*python, "-I", "-c", script, *args],
        env=env,
        user=uid,
        group=uid,
        extra_groups=[],
        stdout=subprocess.PIPE,
        text=True,
    )
