"""``[ingest]`` of the daemon's config: the HTTP endpoint agents and hooks report to, and the
read-only pages (docs/configuration.md). Split from ``daemon_file`` to keep modules small."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any

from pydantic import Field, StrictBool, StrictInt, StrictStr, ValidationInfo, field_validator

from supervisor.config._shared import FloatField, Section, absolute, not_empty
from supervisor.config.errors import fail, fix_hint

_URL = re.compile(r"^https?://[A-Za-z0-9._\[\]:-]{1,255}(/[A-Za-z0-9._~/-]{0,256})?$")  # no comma, no space


def _resolve_path(value: Any, info: ValidationInfo) -> Any:
    value = not_empty(value)
    return absolute(value, info) if isinstance(value, str) else value


class IngestSection(Section):
    """The HTTP endpoint node agents and hooks report to (and /metrics, the logbook pages)."""

    enabled: StrictBool = True
    bind: StrictStr = Field(
        default="127.0.0.1",  # loopback unless configured: compute nodes need the cluster address
        min_length=1,
        json_schema_extra=fix_hint(
            'set the address to listen on, e.g. the login node\'s cluster address bind = "10.1.0.5"'
        ),
    )
    port: StrictInt = Field(
        default=8471, ge=0, le=65535, json_schema_extra=fix_hint("set a TCP port from 1 to 65535 (0: any free port)")
    )
    advertise_url: StrictStr | None = Field(
        default=None,
        pattern=r"^https?://",
        json_schema_extra=fix_hint(
            'give the URL compute nodes reach the daemon at, e.g. advertise_url = "http://login1:8471"'
        ),
    )
    # the other login nodes' daemons of this instance (their advertise_url; issue 33): jobs are
    # given every URL, this daemon's first, so a launcher finds whichever leads after a failover
    peer_urls: tuple[StrictStr, ...] = Field(default=(), max_length=7)
    max_body_bytes: StrictInt = Field(
        default=1 << 20,
        ge=4096,
        le=64 << 20,
        json_schema_extra=fix_hint("set a body size cap from 4096 to 67108864 bytes"),
    )
    hook_token_file: Path | None = None
    # Pages (/metrics, /runs/RUN/logbook) answer only "Authorization: Bearer <this file's token>".
    read_token_file: Path | None = None
    tls_cert_file: Path | None = None  # with tls_key_file: HTTPS (PEM files)
    tls_key_file: Path | None = Field(default=None, validate_default=True)
    max_connections: StrictInt = Field(
        default=1024, ge=8, le=1 << 20, json_schema_extra=fix_hint("set at least the job's node count, e.g. 4096")
    )
    max_connections_per_peer: StrictInt = Field(
        default=32, ge=1, le=1 << 20, json_schema_extra=fix_hint("set connections one address may hold, e.g. 32")
    )
    request_deadline_s: FloatField = Field(
        default=30.0, gt=0, le=600, json_schema_extra=fix_hint("set seconds from 1 to 600, e.g. 30")
    )
    idle_timeout_s: FloatField = Field(
        default=30.0, gt=0, le=3600, json_schema_extra=fix_hint("set seconds, at least the agents' interval, e.g. 30")
    )
    node_networks: tuple[StrictStr, ...] = Field(default=(), max_length=256)

    @field_validator("node_networks")
    @classmethod
    def _networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for text in value:
            try:
                ipaddress.ip_network(text, strict=False)
            except ValueError:
                raise fail(
                    f"{text!r} is not a network", 'write subnets like "10.12.0.0/16" or "fd00:12::/64"'
                ) from None
        return value

    @field_validator("peer_urls")
    @classmethod
    def _peers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for url in value:
            if not _URL.match(url):
                raise fail(
                    f"{url!r} is not an http(s) URL",
                    'list the other daemons\' advertise_url, e.g. ["http://login2:8471"]',
                )
        return tuple(url.rstrip("/") for url in value)

    @field_validator("hook_token_file", "read_token_file", "tls_cert_file", "tls_key_file", mode="before")
    @classmethod
    def _resolve(cls, value: Any, info: ValidationInfo) -> Any:
        return _resolve_path(value, info)

    @field_validator("tls_key_file")
    @classmethod
    def _tls_pair(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if (value is None) != (info.data.get("tls_cert_file") is None):
            raise fail("tls_cert_file and tls_key_file go together", "set both (PEM files), or neither for plain HTTP")
        return value
