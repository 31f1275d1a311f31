"""``[store]`` of the daemon's config: where the instance's memory lives (docs/configuration.md).

No URL: SQLite in ``[daemon] state_dir``, the embedded default. ``url = "postgresql://…"``: a
PostgreSQL database (docs/operations.md, "A shared PostgreSQL store"). The password is never in
the URL — configuration files are read by more than the daemon, and the URL is logged — but in a
file of the daemon's own (``password_file``, mode 600) or a systemd credential
(``password_credential``: ``LoadCredential=NAME:PATH`` in the unit, read from
``$CREDENTIALS_DIRECTORY/NAME``). Split from ``daemon_file`` to keep modules small.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pydantic import Field, StrictStr, ValidationInfo, field_validator, model_validator

from supervisor.config._shared import FloatField, Section, absolute, not_empty
from supervisor.config.errors import fail, fix_hint

SCHEMES = ("postgresql", "postgres")
_CREDENTIAL = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_MOVE_IT = (
    "remove it from the URL and put it in a file of the daemon's own (password_file, mode 600) "
    "or a systemd credential (password_credential)"
)


class StoreSection(Section):
    url: StrictStr | None = Field(
        default=None, json_schema_extra=fix_hint('write a PostgreSQL URL, e.g. "postgresql://team_llm@db1/team_llm"')
    )
    password_file: Path | None = None
    password_credential: StrictStr | None = None
    connect_timeout_s: FloatField = Field(
        default=10.0, gt=0, le=60, json_schema_extra=fix_hint("set seconds above 0 and at most 60, e.g. 10")
    )
    # the leader lease of the daemons sharing the store (engine.loop.leadership): a standby takes over
    # at most this long after the leader's last renewal; the leader stops acting a fifth before
    lease_s: FloatField = Field(
        default=15.0, ge=1, le=300, json_schema_extra=fix_hint("set seconds between 1 and 300, e.g. 15")
    )

    @field_validator("url")
    @classmethod
    def _postgres_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.password is not None or "password" in parse_qs(parts.query):
            raise fail("the URL holds a password", _MOVE_IT, at="password", value="***")  # never shown back
        if parts.scheme not in SCHEMES or not (parts.hostname or "host" in parse_qs(parts.query)):
            raise fail(
                "is not a PostgreSQL URL with a host",
                "write postgresql://USER@HOST[:PORT]/DATABASE (a socket: postgresql:///DATABASE?host=/run/postgresql),"
                ' e.g. "postgresql://team_llm@db1/team_llm"',
            )
        return value

    @field_validator("password_file", mode="before")
    @classmethod
    def _resolve(cls, value: Any, info: ValidationInfo) -> Any:
        value = not_empty(value)
        return absolute(value, info) if isinstance(value, str) else value

    @field_validator("password_credential")
    @classmethod
    def _credential_name(cls, value: str | None) -> str | None:
        if value is not None and not _CREDENTIAL.fullmatch(value):
            raise fail("is not a credential name", 'write the NAME of LoadCredential=NAME:PATH, e.g. "store-password"')
        return value

    @model_validator(mode="after")
    def _one_source(self) -> StoreSection:
        if self.password_file is not None and self.password_credential is not None:
            raise fail("password_file and password_credential are both set", "keep one of them")
        if self.url is None and (self.password_file is not None or self.password_credential is not None):
            raise fail("a password is set but no url", "add url, or remove the password setting")
        return self

    @property
    def postgres(self) -> bool:
        return self.url is not None

    def credential_path(self, environ: Mapping[str, str]) -> Path | None:
        """Where the password is: ``password_file``, or the systemd credential in
        ``$CREDENTIALS_DIRECTORY`` (None: no password, e.g. peer or certificate authentication)."""
        if self.password_file is not None:
            return self.password_file
        if self.password_credential is None:
            return None
        directory = environ.get("CREDENTIALS_DIRECTORY")
        if not directory:
            raise ValueError(
                f"[store] password_credential = {self.password_credential!r}: $CREDENTIALS_DIRECTORY is not set; "
                f"run the daemon under systemd with LoadCredential={self.password_credential}:PATH in its unit, "
                "or use password_file"
            )
        return Path(directory) / self.password_credential
