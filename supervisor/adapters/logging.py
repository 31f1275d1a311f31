"""Logging set up once, at the entry point: structlog for our events, stdlib records (boto3,
urllib3, ...) rendered the same way.

JSON lines for machines (journald, log shippers) when the stream is not a terminal or
``fmt="json"``; a readable console rendering on a terminal. Timestamps are ISO 8601 in UTC.
Context bound with ``structlog.contextvars.bind_contextvars(run=..., job_id=...)`` appears on
every event. Values under keys that look like secrets are replaced by ``"[redacted]"``.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

__all__ = ["FORMATS", "LEVELS", "REDACTED", "configure_logging", "is_secret_key", "redact_secrets"]

LEVELS: Mapping[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
FORMATS = ("auto", "json", "console")
REDACTED = "[redacted]"

# A key is secret when one of its words is one of these ("db_password", "authToken", "Cookie"),
# or when its last word is "key" ("api_key", "private_key"; but "key_id" is an identifier).
_SECRET_WORDS = frozenset(
    {"token", "password", "passwd", "secret", "apikey", "credential", "credentials", "authorization", "cookie"}
)
_WORD_BREAK = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
_OUR_HANDLER = "_slurm_supervisor_handler"


def is_secret_key(name: str) -> bool:
    """Whether a value logged under ``name`` must not be shown."""
    words = [word.lower() for word in _WORD_BREAK.split(name) if word]
    return bool(words) and (words[-1] == "key" or any(word in _SECRET_WORDS for word in words))


def redact_secrets(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """A structlog processor: hide values under secret-looking keys, in nested tables too."""
    _redact(event_dict)
    return event_dict


def _redact(table: MutableMapping[str, Any]) -> None:
    for name, value in list(table.items()):
        if isinstance(name, str) and is_secret_key(name):
            table[name] = REDACTED
        elif isinstance(value, Mapping):
            copy = dict(value)  # never change the caller's object
            _redact(copy)
            table[name] = copy


def configure_logging(level: str = "info", fmt: str = "auto", stream: TextIO | None = None) -> None:
    """Configure structlog and the stdlib root logger; call again to replace the setup.

    ``level`` is one of LEVELS, ``fmt`` one of FORMATS; ``stream`` defaults to stderr.
    """
    if level.lower() not in LEVELS:
        raise ValueError(f"log level {level!r}: use one of {', '.join(LEVELS)}")
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: use one of {', '.join(FORMATS)}")
    out = sys.stderr if stream is None else stream
    number = LEVELS[level.lower()]
    structlog.configure(
        processors=[*_shared_processors(), structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        wrapper_class=structlog.make_filtering_bound_logger(number),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=False,  # the daemon logs a few lines a tick; reconfiguring must work
    )
    _install_root_handler(out, number, _wants_console(fmt, out))


def _shared_processors() -> list[Processor]:
    """What every event gets, ours and the stdlib's alike."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        redact_secrets,
    ]


def _wants_console(fmt: str, stream: TextIO) -> bool:
    if fmt == "auto":
        isatty = getattr(stream, "isatty", None)
        return bool(isatty and isatty())
    return fmt == "console"


def _renderers(console: bool, stream: TextIO) -> list[Processor]:
    if console:
        isatty = getattr(stream, "isatty", None)
        return [structlog.dev.ConsoleRenderer(colors=bool(isatty and isatty()))]
    return [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]


def _install_root_handler(stream: TextIO, level: int, console: bool) -> None:
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_shared_processors(),
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *_renderers(console, stream)],
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    setattr(handler, _OUR_HANDLER, True)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _OUR_HANDLER, False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
