"""Pieces both config files use: the frozen section base, path resolution, number fields."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo

from supervisor.config.errors import fail

# TOML integers are accepted where a decimal is asked for; strings and booleans are not.
FloatField = Annotated[float, Field(strict=True)]


class Section(BaseModel):
    """A frozen TOML table that rejects keys it does not know."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def base_dir(info: ValidationInfo) -> Path:
    """The folder of the file being validated (``context={"base_dir": ...}``), else the cwd."""
    context = info.context if isinstance(info.context, Mapping) else {}
    return Path(context.get("base_dir") or Path.cwd())


# Linux's limits: a longer name or path makes every check of it raise ENAMETOOLONG.
NAME_MAX = 255
PATH_MAX = 4096


def absolute(value: str, info: ValidationInfo) -> Path:
    """``value`` taken from the file's folder when relative; normalised, symlinks kept. A path the
    system cannot take (a name over NAME_MAX, the whole over PATH_MAX) is refused here."""
    path = Path(os.path.normpath(base_dir(info) / value))
    if len(os.fsencode(path)) >= PATH_MAX or any(len(os.fsencode(part)) > NAME_MAX for part in path.parts):
        raise fail(
            f"the path is longer than the system takes ({NAME_MAX} bytes a name, {PATH_MAX} in all)",
            "shorten it",
        )
    return path


def not_empty(value: Any) -> Any:
    """A ``mode="before"`` check for path keys: an empty string would silently mean '.'."""
    if isinstance(value, str) and not value.strip():
        raise fail("must not be empty", "give a path, or remove the key to use the default")
    return value


def missing_path_fix(value: str, what: str) -> str:
    if value.startswith("~"):
        return "write the full path; '~' is not expanded (relative paths start at the file's folder)"
    return f"create the {what}, or correct the path (relative paths start at the file's folder)"
