"""ConfigError, and the translation of TOML and pydantic errors into lines a person can act on.

A line reads ``FILE: KEY = VALUE: WHAT IS WRONG. Fix: WHAT TO DO.``, for example
``run.toml: restart.max_restarts = -1: must be >= 0. Fix: set a non-negative number of restarts.``
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails, PydanticCustomError


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong with a config file.

    ``key`` is dotted (``restart.max_restarts``, ``run.sbatch_args[1]``), "" for the whole file;
    ``value`` is the offending value written as TOML, when there is one.
    """

    key: str
    problem: str
    fix: str
    value: str | None = None

    def render(self, source: str) -> str:
        where = self.key + (f" = {self.value}" if self.value is not None else "")
        head = f"{source}: {where}: " if where else f"{source}: "
        return f"{head}{self.problem.rstrip('.')}. Fix: {self.fix.rstrip('.')}."


class ConfigError(Exception):
    """A config file cannot be used. The message has one line per problem."""

    def __init__(self, source: str, problems: Sequence[ConfigProblem]) -> None:
        self.source = source
        self.problems = tuple(problems)
        super().__init__("\n".join(p.render(source) for p in self.problems))


def fail(problem: str, fix: str, *, at: int | str | None = None, value: Any = None) -> PydanticCustomError:
    """An error for a validator to raise; the fix travels in the error's context. ``at`` names the
    part of the field's value that is wrong (``run.sbatch_args[2]``, ``run.env.PATH``) and ``value``
    that part, when a validator of the whole field finds it."""
    context: dict[str, Any] = {"fix": fix}
    if at is not None:
        context.update(at=at, value=value)
    return PydanticCustomError("config", problem, context)  # only "{fix}" would be substituted


def fix_hint(text: str) -> dict[str, Any]:
    """``Field(json_schema_extra=fix_hint(...))``: how to fix a bad value of this field."""
    return {"fix": text}


def did_you_mean(word: str, known: Iterable[str]) -> str | None:
    """The known name ``word`` most likely meant: same but for case, then a prefix, then close."""
    known, lower = list(known), word.lower()
    by_case = [k for k in known if k.lower() == lower]
    by_prefix = [k for k in known if len(lower) >= 3 and (k.lower().startswith(lower) or lower.startswith(k.lower()))]
    close = by_case or by_prefix or difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    return close[0] if close else None


# --------------------------------------------------------------------------- TOML syntax

_AT = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")


def syntax_problem(message: str, text: str) -> ConfigProblem:
    """A tomllib error message (``... (at line 3, column 9)``) with the offending line shown."""
    where = _AT.search(message)
    if where is None:
        return ConfigProblem("", f"not valid TOML: {message}", "correct the TOML syntax")
    line, column = int(where.group(1)), int(where.group(2))
    lines = text.splitlines()
    shown = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    problem = f"not valid TOML at line {line}, column {column} ({message[: where.start()]}): {shown}"
    fix = f'correct line {line}; strings need double quotes (name = "x"), arrays [ ], and each key appears once'
    return ConfigProblem("", problem, fix)


# --------------------------------------------------------------------------- pydantic errors


def translate(root: type[BaseModel], error: ErrorDetails) -> ConfigProblem:
    """One pydantic error against the file model ``root`` as a :class:`ConfigProblem`."""
    loc = tuple(error["loc"])
    if error["type"] == "extra_forbidden":
        return _unknown_key(root, loc, error["input"])
    ctx = error.get("ctx") or {}
    key = dotted(loc + ((ctx["at"],) if "at" in ctx else ()))
    if error["type"] == "missing":
        return ConfigProblem(key, "is missing", _field_fix(root, loc) or f"add {_example(loc)}")
    problem = _describe(error)
    fix = ctx.get("fix") or _field_fix(root, loc) or _generic_fix(error)
    value = ctx["value"] if "at" in ctx else error["input"]
    shown = None if value is None else toml_value(value)  # TOML has no null: absent
    return ConfigProblem(key, problem, str(fix), shown)


def dotted(loc: Sequence[int | str]) -> str:
    """``("run", "sbatch_args", 1)`` → ``run.sbatch_args[1]``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def toml_value(value: Any, limit: int = 80) -> str:
    """``value`` written as it would appear in a TOML file, shortened past ``limit``."""
    text = _toml(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    return str(value)


_KINDS: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (bool, "a boolean"),
    (int, "an integer"),
    (float, "a decimal number"),
    (str, "a string"),
    ((list, tuple), "an array"),
    (dict, "a table"),
    ((datetime, date, time), "a date/time"),
)


def _kind(value: Any) -> str:
    return next((name for types, name in _KINDS if isinstance(value, types)), type(value).__name__)


_TYPES = {  # error type: (what is wrong, how to write it instead)
    "int_type": ("must be a whole number", "write a whole number without quotes, e.g. 8"),
    "float_type": ("must be a number", "write a number without quotes, e.g. 5.0"),
    "bool_type": ("must be true or false", "write true or false, without quotes"),
    "string_type": ("must be a string", 'put the value in double quotes, e.g. "value"'),
    "list_type": ("must be an array", 'write an array, e.g. ["a", "b"]'),
    "tuple_type": ("must be an array", 'write an array, e.g. ["a", "b"]'),
    "dict_type": ("must be a table", 'write a table, e.g. { KEY = "value" }'),
    "path_type": ("must be a path", 'put the path in double quotes, e.g. "/var/lib/x"'),
}
_BOUNDS = {"greater_than_equal": ">=", "less_than_equal": "<=", "greater_than": ">", "less_than": "<"}


def _describe(error: ErrorDetails) -> str:
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind in _TYPES:
        return f"{_TYPES[kind][0]}, not {_kind(error['input'])}"
    if kind in ("model_type", "model_attributes_type"):
        return f"must be a table, not {_kind(error['input'])}"
    if kind in _BOUNDS:
        bound = next(iter(ctx.values()))
        return f"must be {_BOUNDS[kind]} {bound}"
    if kind in ("literal_error", "enum"):
        return f"must be one of {ctx.get('expected', '')}".replace("'", '"')
    if kind == "string_pattern_mismatch":
        return "is not in the allowed form"
    if kind in ("string_too_short", "too_short"):
        return "must not be empty"
    message = error["msg"]
    return message[:1].lower() + message[1:]


def _generic_fix(error: ErrorDetails) -> str:
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind in _BOUNDS:
        return f"use a value {_BOUNDS[kind]} {next(iter(ctx.values()))}"
    if kind in ("literal_error", "enum"):
        return "write one of those values, in double quotes"
    if kind in ("model_type", "model_attributes_type"):
        return f"write it as a [{dotted(error['loc'])}] section"
    if kind in _TYPES:
        return _TYPES[kind][1]
    return "see docs/configuration.md"


# --------------------------------------------------------------------------- the file's shape


def _model_at(root: type[BaseModel], path: Sequence[int | str]) -> type[BaseModel] | None:
    """The section model at ``path`` (``()`` is the file itself), if there is one."""
    model: type[BaseModel] | None = root
    for part in path:
        field = _fields(model).get(str(part))
        model = _section_type(field)
    return model


def _fields(model: type[BaseModel] | None) -> dict[str, FieldInfo]:
    return dict(model.model_fields) if model is not None else {}


def _section_type(field: FieldInfo | None) -> type[BaseModel] | None:
    annotation = field.annotation if field is not None else None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _field_fix(root: type[BaseModel], loc: Sequence[int | str]) -> str | None:
    """The fix hint of the innermost field on ``loc`` that has one (``run.env.X`` → ``run.env``)."""
    model: type[BaseModel] | None = root
    found: str | None = None
    for part in loc:
        field = _fields(model).get(str(part))
        if field is None:
            break
        extra = field.json_schema_extra
        found = str(extra["fix"]) if isinstance(extra, dict) and extra.get("fix") else found
        model = _section_type(field)
    return found


def _example(loc: Sequence[int | str]) -> str:
    if len(loc) == 1:
        return f"a [{loc[0]}] section"
    return f"{loc[-1]} = ... under [{dotted(loc[:-1])}]"


def _unknown_key(root: type[BaseModel], loc: tuple[int | str, ...], value: Any) -> ConfigProblem:
    name, parent = str(loc[-1]), loc[:-1]
    known = list(_fields(_model_at(root, parent)))
    is_section = not parent and isinstance(value, dict)
    label = f"[{name}]" if is_section else dotted(loc)
    problem = "unknown section" if is_section else ("unknown key" if parent else "key outside any section")
    fix = _unknown_key_fix(root, name, parent, known, is_section)
    return ConfigProblem(label, problem, fix)


def _unknown_key_fix(
    root: type[BaseModel], name: str, parent: tuple[int | str, ...], known: list[str], is_section: bool
) -> str:
    where = f"[{dotted(parent)}]" if parent else "the file"
    allowed = ", ".join(f"[{k}]" for k in known) if not parent else ", ".join(known)
    bare_key = not parent and not is_section  # a key above every [section]: never a section's name
    close = None if bare_key else did_you_mean(name, known)
    if close is not None:
        return f"rename it to {f'[{close}]' if is_section else close} (allowed in {where}: {allowed})"
    home = _section_holding(root, name, parent)
    if home is not None:
        return f"move it under [{home}]"
    return f"remove it (allowed in {where}: {allowed})"


def _section_holding(root: type[BaseModel], name: str, exclude: tuple[int | str, ...]) -> str | None:
    """The top-level section that has a key called ``name``, other than ``exclude``."""
    for section, field in root.model_fields.items():
        model = _section_type(field)
        if model is not None and (section,) != exclude and name in model.model_fields:
            return section
    return None
