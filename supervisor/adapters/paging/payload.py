"""A page: the ``Alert`` the pager raises, and the JSON body each webhook format sends for it.

Logbook text quotes node agents and job logs, so nothing here sends a control character
(``text_safety.printable``), and Slack's mrkdwn gets ``&``, ``<`` and ``>`` escaped
(``text_safety.slack``): ``<!channel>`` pings no one, ``<URL|text>`` links nowhere.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from supervisor.domain.text_safety import printable, slack

FORMATS = ("slack", "pagerduty")
_SEVERITY = {
    "gave_up": "critical",
    "mass_fault": "critical",
    "checkpoint_stale": "error",
    "repeated_rollbacks": "error",
    "rollback_blocked": "error",
    "slowdown": "warning",
    "stuck": "error",
    "crash_loop": "error",
}


@dataclass(frozen=True)
class Alert:
    dedup_key: str
    action: str  # "trigger" or "resolve"
    run: str
    kind: str  # one of PAGE_KINDS
    summary: str
    at: float
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def severity(self) -> str:
        return _SEVERITY.get(self.kind, "error")


# ---------------------------------------------------------------- payloads


def payload(alert: Alert, fmt: str, routing_key: str | None = None, source: str | None = None) -> dict[str, Any]:
    """The JSON body: Slack incoming-webhook or PagerDuty Events API v2. Logbook text quotes agents
    and job logs: no control character is sent, and Slack's ``&``, ``<`` and ``>`` are escaped
    (``<!channel>`` pings no one, ``<URL|text>`` links nowhere)."""
    if fmt == "slack":
        icon = ":white_check_mark:" if alert.action == "resolve" else ":rotating_light:"
        when = datetime.fromtimestamp(alert.at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        text = f"{icon} [{alert.severity}] {slack(alert.summary)}"
        return {
            "text": text,
            "blocks": [
                {"type": "section", "text": {"type": "mrkdwn", "text": text}},
                {
                    "type": "context",
                    "elements": [
                        {
                            "type": "mrkdwn",
                            "text": f"{when} · run `{slack(alert.run)}` · {alert.kind} · dedup `{slack(alert.dedup_key)}`",
                        }
                    ],
                },
            ],
        }
    if fmt == "pagerduty":
        body: dict[str, Any] = {
            "routing_key": routing_key or "",
            "event_action": alert.action,
            "dedup_key": printable(alert.dedup_key),
        }
        if alert.action == "trigger":
            body["payload"] = {
                "summary": printable(alert.summary)[:1024],
                "source": source or socket.gethostname(),
                "severity": alert.severity,
                "timestamp": datetime.fromtimestamp(alert.at, UTC).isoformat(),
                "component": printable(alert.run),
                "group": "slurm-supervisor",
                "class": alert.kind,
                "custom_details": _printable(json.loads(json.dumps(dict(alert.details), default=str))),
            }
        return body
    raise ValueError(f"[notify] format {fmt!r}: choose one of {', '.join(FORMATS)}")


def _printable(value: Any) -> Any:
    """JSON-ready ``value`` with every string (keys too) through ``printable``."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, list):
        return [_printable(v) for v in value]
    if isinstance(value, dict):
        return {printable(k): _printable(v) for k, v in value.items()}
    return value
