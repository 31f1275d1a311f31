"""Local accounts for tests that act as several people (the daemon's owner, another team, an admin).

Created once per machine with ``useradd`` (root only); names start with ``ssv-`` so they cannot be
mistaken for real accounts. Real Slurm clients work as these users against ``LocalSlurm``: munge's
socket is world-searchable and slurmd runs as root, so a job runs under the submitter's UID.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
from collections.abc import Mapping, Sequence


class UsersUnavailable(RuntimeError):
    """Accounts cannot be made here (not root, or no useradd)."""


def local_user(name: str, groups: Sequence[str] = ()) -> pwd.struct_passwd:
    """The account ``name`` (``ssv-`` prefix required), created with a home and ``groups`` if new."""
    if not name.startswith("ssv-"):
        raise ValueError(f"test accounts start with 'ssv-': {name!r}")
    for group in groups:
        _ensure_group(group)
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        _run(["useradd", "--create-home", "--shell", "/bin/bash", name])
        entry = pwd.getpwnam(name)
    for group in groups:
        if name not in grp.getgrnam(group).gr_mem:
            _run(["usermod", "--append", "--groups", group, name])
    return entry


def _ensure_group(group: str) -> None:
    try:
        grp.getgrnam(group)
    except KeyError:
        _run(["groupadd", group])


def _run(argv: list[str]) -> None:
    if os.geteuid() != 0 or shutil.which(argv[0]) is None:
        raise UsersUnavailable(f"cannot run {argv[0]} here (needs root and the passwd tools)")
    subprocess.run(argv, check=True, capture_output=True, text=True)  # noqa: S603 - argv list


def as_user(
    name: str, argv: Sequence[str], *, env: Mapping[str, str], cwd: str = "/", timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as ``name`` (``runuser``, no login shell) with exactly ``env``."""
    return subprocess.run(  # noqa: S603 - argv list, no shell
        ["runuser", "-u", name, "--", *argv],
        env=dict(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
