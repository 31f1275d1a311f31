"""configure_logging rendered into a StringIO: JSON lines, console, context, redaction."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
import structlog

from supervisor.adapters.logging import REDACTED, configure_logging, is_secret_key, redact_secrets


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    root.handlers[:] = handlers
    root.setLevel(level)


def json_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_with_utc_iso_timestamps() -> None:
    out = io.StringIO()
    configure_logging("info", "auto", out)  # a StringIO is not a terminal
    structlog.get_logger("supervisor.test").info("run_started", nodes=16)
    [line] = json_lines(out)
    assert line["event"] == "run_started" and line["nodes"] == 16
    assert line["level"] == "info" and line["logger"] == "supervisor.test"
    stamp = datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00"))
    assert stamp.utcoffset() == timedelta(0)


def test_context_vars_show_up() -> None:
    out = io.StringIO()
    configure_logging("info", "json", out)
    structlog.contextvars.bind_contextvars(run="llama-70b", job_id=4242)
    structlog.get_logger().warning("node_suspect", node="gpu-7")
    [line] = json_lines(out)
    assert (line["run"], line["job_id"], line["node"]) == ("llama-70b", 4242, "gpu-7")


def test_level_filters() -> None:
    out = io.StringIO()
    configure_logging("WARNING", "json", out)
    log = structlog.get_logger()
    log.info("quiet")
    log.error("loud")
    assert [line["event"] for line in json_lines(out)] == ["loud"]


def test_secrets_are_redacted_in_the_output() -> None:
    out = io.StringIO()
    configure_logging("info", "json", out)
    headers = {"Authorization": "Bearer abc", "Accept": "json"}
    structlog.get_logger().info(
        "s3_connect",
        token="t0p",
        db_password="hunter2",
        aws_secret_access_key="AKIA-SECRET",
        apiKey="k",
        headers=headers,
        access_key_id="AKIAPUBLIC",
        tokens_per_s=1234.5,
        endpoint="http://s3",
    )
    [line] = json_lines(out)
    for name in ("token", "db_password", "aws_secret_access_key", "apiKey"):
        assert line[name] == REDACTED, name
    assert line["headers"] == {"Authorization": REDACTED, "Accept": "json"}
    assert headers["Authorization"] == "Bearer abc", "the caller's dict is not changed"
    assert line["access_key_id"] == "AKIAPUBLIC" and line["tokens_per_s"] == 1234.5
    assert "hunter2" not in out.getvalue() and "t0p" not in out.getvalue()


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("token", True),
        ("auth_token", True),
        ("refreshToken", True),
        ("password", True),
        ("PASSWORD", True),
        ("client-secret", True),
        ("api_key", True),
        ("private_key", True),
        ("key", True),
        ("credentials", True),
        ("cookie", True),
        ("access_key_id", False),
        ("monkey", False),
        ("keyboard", False),
        ("tokens_per_s", False),
        ("run", False),
        ("event", False),
    ],
)
def test_is_secret_key(name: str, secret: bool) -> None:
    assert is_secret_key(name) is secret


def test_redact_processor_alone() -> None:
    event = {"event": "x", "password": "p", "nested": {"secret": "s", "ok": 1}}
    assert redact_secrets(None, "info", event) == {
        "event": "x",
        "password": REDACTED,
        "nested": {"secret": REDACTED, "ok": 1},
    }


def test_stdlib_records_come_out_as_json_too() -> None:
    out = io.StringIO()
    configure_logging("info", "json", out)
    logging.getLogger("botocore.retry").warning("retrying %s", "PutObject")
    [line] = json_lines(out)
    assert line["event"] == "retrying PutObject"
    assert line["logger"] == "botocore.retry" and line["level"] == "warning" and "timestamp" in line


def test_exceptions_are_rendered_in_json() -> None:
    out = io.StringIO()
    configure_logging("info", "json", out)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        structlog.get_logger().exception("tick_failed")
    [line] = json_lines(out)
    assert line["level"] == "error" and "RuntimeError: boom" in line["exception"]


def test_console_on_a_terminal() -> None:
    out = FakeTerminal()
    configure_logging("info", "auto", out)
    structlog.get_logger().info("run_started", run="llama-70b", password="p")
    text = out.getvalue()
    assert "run_started" in text and "llama-70b" in text and "[redacted]" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text.splitlines()[0])


def test_json_forced_on_a_terminal() -> None:
    out = FakeTerminal()
    configure_logging("info", "json", out)
    structlog.get_logger().info("hello")
    assert json_lines(out)[0]["event"] == "hello"


def test_console_forced_off_a_terminal_has_no_colour_codes() -> None:
    out = io.StringIO()
    configure_logging("info", "console", out)
    structlog.get_logger().info("hello", run="r")
    assert "hello" in out.getvalue() and "\x1b[" not in out.getvalue()


def test_configuring_again_replaces_the_setup() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", "json", first)
    configure_logging("info", "json", second)
    structlog.get_logger().info("once")
    logging.getLogger("lib").warning("once too")
    assert first.getvalue() == ""
    assert [line["event"] for line in json_lines(second)] == ["once", "once too"]


@pytest.mark.parametrize(("level", "fmt"), [("loud", "json"), ("info", "xml")])
def test_bad_level_or_format(level: str, fmt: str) -> None:
    with pytest.raises(ValueError, match="use one of"):
        configure_logging(level, fmt, io.StringIO())
