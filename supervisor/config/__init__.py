"""Configuration files: the run spec (``RUN.toml``) and the daemon config (``supervisor.toml``).

Both are TOML, validated at load into frozen pydantic models. Every problem is reported as a
:class:`ConfigError` whose lines name the file, the dotted key, what is wrong and how to fix it;
pydantic's own errors never reach a person. docs/configuration.md is the reference.
"""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Collection
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from supervisor.config.daemon_file import (
    DaemonConfig,
    DaemonSection,
    FenceSection,
    LoggingSection,
    ProbeSection,
    SlurmSection,
)
from supervisor.config.errors import ConfigError, ConfigProblem, did_you_mean, syntax_problem, toml_value, translate
from supervisor.config.hooks_file import HooksConfig
from supervisor.config.restart_section import RestartSection
from supervisor.config.run_file import RunFile, RunSection, SparesSection
from supervisor.domain.run import RunSpec

__all__ = [
    "ConfigError",
    "ConfigProblem",
    "DaemonConfig",
    "DaemonSection",
    "FenceSection",
    "LoggingSection",
    "ProbeSection",
    "RestartSection",
    "RunFile",
    "RunSection",
    "SlurmSection",
    "SparesSection",
    "check_partition",
    "load_daemon_config",
    "load_hooks_config",
    "HooksConfig",
    "load_run_file",
    "load_run_spec",
]

_Model = TypeVar("_Model", bound=BaseModel)


def load_run_spec(path: str | os.PathLike[str], daemon_dirs: Collection[str] = ()) -> RunSpec:
    """Read and check a ``RUN.toml``; relative paths in it are taken from its folder. No file of
    the run may lie in ``daemon_dirs`` (the daemon's configured folders) or the default ones."""
    return load_run_file(path, daemon_dirs).to_run_spec()


def load_run_file(path: str | os.PathLike[str], daemon_dirs: Collection[str] = ()) -> RunFile:
    """The validated ``RUN.toml`` model itself (``load_run_spec`` turns it into a RunSpec)."""
    file = Path(path)
    return _validate(RunFile, _read_toml(file), file, {"daemon_dirs": tuple(daemon_dirs)})


def load_daemon_config(path: str | os.PathLike[str] | None) -> DaemonConfig:
    """Read and check a ``supervisor.toml``; ``None`` gives every default."""
    if path is None:
        return DaemonConfig()
    file = Path(path)
    return _validate(DaemonConfig, _read_toml(file), file)


def load_hooks_config(path: str | os.PathLike[str] | None) -> HooksConfig:
    """Read and check a ``hooks.toml``; ``None`` gives every default."""
    if path is None:
        return HooksConfig()
    file = Path(path)
    return _validate(HooksConfig, _read_toml(file), file)


def check_partition(spec: RunSpec, partitions: Collection[str]) -> None:
    """Raise :class:`ConfigError` unless every partition the run names is one Slurm knows.

    ``partitions`` as Slurm lists them; a trailing ``*`` (sinfo's mark of the default) is ignored.
    """
    known = sorted({p.rstrip("*") for p in partitions})
    missing = [p for p in spec.partition.split(",") if p not in known]
    if not missing:
        return
    if known:
        close = did_you_mean(missing[0], known)
        fix = f"set partition to one of: {', '.join(known)}" + (f" (did you mean {close!r}?)" if close else "")
    else:
        fix = "Slurm listed no partitions at all; check that the supervisor reaches slurmctld (sinfo -s)"
    problem = ConfigProblem("run.partition", f"Slurm has no partition {missing[0]!r}", fix, toml_value(spec.partition))
    raise ConfigError(f"run {spec.name}", [problem])


MAX_FILE_BYTES = 1 << 20  # a spec or config larger than this is no spec: refused before it is read whole
_OPEN = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY  # a FIFO opens without a writer, reads nothing


def _read_bounded(file: Path) -> bytes:
    """At most ``MAX_FILE_BYTES`` of a regular file: ``/dev/zero``, a FIFO or a folder is refused
    before anything is read (issue 32, finding 10: ``submit /dev/zero`` grew the daemon until it
    was OOM-killed; a FIFO held an API thread for good)."""
    fd = os.open(file, _OPEN)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _NotAFile("not a regular file")
        data = os.read(fd, MAX_FILE_BYTES + 1)
        while len(data) <= MAX_FILE_BYTES and (more := os.read(fd, MAX_FILE_BYTES + 1 - len(data))):
            data += more
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise _NotAFile(f"larger than {MAX_FILE_BYTES} bytes")
    return data


class _NotAFile(Exception):
    """What the config reader refuses to read."""


def _read_toml(file: Path) -> dict[str, Any]:
    try:
        text = _read_bounded(file).decode("utf-8")
    except _NotAFile as refused:
        problem = ConfigProblem("", f"cannot read the file: {refused}", "give the path of the TOML file itself")
        raise ConfigError(str(file), [problem]) from None
    except OSError as error:
        problem = ConfigProblem("", f"cannot read the file ({error.strerror})", "check the path and its permissions")
        raise ConfigError(str(file), [problem]) from None
    except UnicodeDecodeError as error:
        problem = ConfigProblem("", f"not UTF-8 text (byte {error.start})", "save the file as UTF-8")
        raise ConfigError(str(file), [problem]) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(str(file), [syntax_problem(str(error), text)]) from None


def _validate(model: type[_Model], data: dict[str, Any], file: Path, context: dict[str, Any] | None = None) -> _Model:
    try:
        return model.model_validate(data, context={"base_dir": file.absolute().parent, **(context or {})})
    except ValidationError as error:
        problems = [translate(model, details) for details in error.errors(include_url=False)]
        raise ConfigError(str(file), problems) from None
