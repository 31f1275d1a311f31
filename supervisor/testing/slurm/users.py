"""Local accounts for tests that act as several people (the daemon's owner, another team, an admin).

Created once per machine with ``useradd`` (root only); names start with ``ssv-`` so they cannot be
mistaken for real accounts. Real Slurm clients work as these users against ``LocalSlurm``: munge's
socket is world-searchable and slurmd runs as root, so a job runs under the submitter's UID.
"""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


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


SHARED_PYTHONS = "/var/cache/slurm-supervisor/python"  # world-readable copies (shared_interpreter)


def python_for_others() -> tuple[list[str], dict[str, str]]:
    """An interpreter other accounts can run with this project importable: ``(argv prefix, env)``.
    This one when every folder above it is searchable by others; else the system's ``python3`` of
    the same version, or else a world-readable copy of this one (``shared_interpreter``: Debian 13
    has no python3.11), with this environment's packages on PYTHONPATH (a pyenv under a 0700 /root)."""
    import sys
    import sysconfig

    real = Path(sys.executable).resolve()
    if all(p.stat().st_mode & 0o001 for p in real.parents):
        return [sys.executable], {}
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which("python3", path="/usr/bin:/bin")
    env: dict[str, str] = {}
    if system is None or not Path(f"/usr/lib/python{version}").is_dir():
        copy = shared_interpreter()
        system, env["LD_LIBRARY_PATH"] = str(copy / "bin" / f"python{version}"), str(copy / "lib")
    root = Path(__file__).resolve().parents[3]
    # every site directory this interpreter reads, those a .pth file adds too (a worktree's venv
    # names main's packages in one: PYTHONPATH alone would not read it)
    sites = [sysconfig.get_paths()["purelib"], *(p for p in sys.path if p.endswith("site-packages"))]
    return [system], {**env, "PYTHONPATH": ":".join([*dict.fromkeys(sites), str(root)])}


def shared_interpreter() -> Path:
    """A copy of this interpreter's installation others may run: its binary, libpython and standard
    library (no site-packages, no tests: ~150 MB), under ``SHARED_PYTHONS``, made once per machine
    and version and published by a rename, so a half-made copy is never used. The binary finds its
    standard library beside it (``lib/pythonX.Y``) and libpython through ``LD_LIBRARY_PATH`` (pyenv's
    RUNPATH names the private original). Root only."""
    import platform
    import sys
    import tempfile

    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    dest = (
        Path(SHARED_PYTHONS)
        / f"{platform.python_version()}-{hashlib.sha256(sys.base_prefix.encode()).hexdigest()[:12]}"
    )
    if (dest / "bin" / f"python{version}").is_file():
        return dest
    if os.geteuid() != 0:
        raise UsersUnavailable(
            f"no interpreter for other accounts: {sys.executable} is private (needs root to copy it)"
        )
    base = Path(sys.base_prefix)
    dest.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".partial-"))
    (partial / "bin").mkdir()
    shutil.copy2(Path(sys.executable).resolve(), partial / "bin" / f"python{version}")
    (partial / "lib").mkdir()
    for lib in base.glob("lib/libpython*.so*"):
        shutil.copy2(lib, partial / "lib" / lib.name, follow_symlinks=False)
    skip = shutil.ignore_patterns("site-packages", "test")
    shutil.copytree(base / "lib" / f"python{version}", partial / "lib" / f"python{version}", ignore=skip, symlinks=True)
    os.chmod(partial, 0o755)  # noqa: S103 - others must run it (mkdtemp made it 0700)
    try:
        os.rename(partial, dest)
    except OSError as exc:  # another process published it first, or the copy cannot be published
        shutil.rmtree(partial, ignore_errors=True)
        if not (dest / "bin" / f"python{version}").is_file():
            raise UsersUnavailable(f"could not publish the shared interpreter at {dest}: {exc}") from exc
    return dest
