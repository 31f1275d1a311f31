"""The guard's own configuration, ``guard.toml`` (root's, not any instance's): who its admins are,
the cluster-wide cap, its state directory, how it reaches Slurm and how long a fault keeps a node
in the shared quarantine. Every key has a default; docs/guard.md is the reference."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field, StrictInt, StrictStr, ValidationInfo, field_validator

from supervisor.adapters.guard_client import DEFAULT_SOCKET
from supervisor.config import _read_toml, _validate
from supervisor.config._shared import FloatField, Section, absolute, not_empty
from supervisor.config.daemon_file import LoggingSection, SlurmSection
from supervisor.config.errors import fix_hint
from supervisor.config.store_section import StoreSection
from supervisor.domain.health.quarantine import QuarantineSettings
from supervisor.guard.policy import Limits

DEFAULT_CONFIG = "/etc/slurm-supervisor/guard.toml"


class GuardSection(Section):
    socket: Path = Path(DEFAULT_SOCKET)  # bound only when systemd passed no socket
    # Only this group's members may connect to a socket the guard binds itself (mode 0660); none:
    # anyone (0666). The shipped socket unit says the same with SocketGroup= and SocketMode=.
    socket_group: StrictStr | None = None
    state_dir: Path = Path("/var/lib/slurm-supervisor-guard")
    admin_groups: tuple[StrictStr, ...] = ()
    # Accounts that run supervisor instances: the guard keeps connection slots for them (and admins).
    instance_users: tuple[StrictStr, ...] = ()
    max_drains: StrictInt = Field(
        default=8, ge=0, json_schema_extra=fix_hint("set how many nodes all instances together may drain per window")
    )
    window_s: FloatField = Field(default=3600.0, gt=0, json_schema_extra=fix_hint("set seconds, e.g. 3600"))
    # A maintenance reservation (remedy RESERVE) ends by itself after this, should nobody remove it.
    reservation_minutes: StrictInt = Field(
        default=120, ge=5, le=7 * 24 * 60, json_schema_extra=fix_hint("set minutes from 5 to 10080, e.g. 120")
    )
    # A client sends its line as soon as it connects; a silent one costs a descriptor for this long.
    request_timeout_s: FloatField = Field(
        default=1.0, gt=0, le=60, json_schema_extra=fix_hint("set seconds above 0 and at most 60, e.g. 1")
    )
    audit_max_mb: FloatField = Field(
        default=64.0, gt=0, json_schema_extra=fix_hint("set the audit log's size before it is rotated, in MB")
    )
    audit_keep: StrictInt = Field(
        default=4, ge=1, le=100, json_schema_extra=fix_hint("set how many rotated audit logs to keep, e.g. 4")
    )
    idle_exit_s: FloatField = Field(
        default=0.0, ge=0, json_schema_extra=fix_hint("set seconds (0: never exit when idle)")
    )

    @field_validator("socket", "state_dir", mode="before")
    @classmethod
    def _resolve(cls, value: Any, info: ValidationInfo) -> Any:
        value = not_empty(value)
        return absolute(value, info) if isinstance(value, str) else value

    def limits(self) -> Limits:
        return Limits(frozenset(self.admin_groups), self.max_drains, self.window_s, self.reservation_minutes)


class SharedQuarantineSection(Section):
    """A node with ``faults`` faults within ``window_h`` (from any instance) is kept out of every
    instance's next submissions for ``base_h``, doubling per further fault, at most ``max_h``."""

    faults: StrictInt = Field(default=1, ge=1, json_schema_extra=fix_hint("set how many faults quarantine a node"))
    window_h: FloatField = Field(default=168.0, gt=0, json_schema_extra=fix_hint("set hours above 0, e.g. 168"))
    base_h: FloatField = Field(default=24.0, gt=0, json_schema_extra=fix_hint("set hours above 0, e.g. 24"))
    max_h: FloatField = Field(default=720.0, gt=0, json_schema_extra=fix_hint("set hours above 0, e.g. 720"))

    def settings(self) -> QuarantineSettings:
        return QuarantineSettings(self.faults, self.window_h * 3600, self.base_h * 3600, self.max_h * 3600)


class GuardSlurmSection(SlurmSection):
    """As the daemon's ``[slurm]``, with a shorter command timeout: one request runs squeue and
    scontrol, both within an instance's ``[guard] timeout_s`` (15 s)."""

    command_timeout_s: FloatField = Field(
        default=5.0, gt=0, le=60, json_schema_extra=fix_hint("set seconds above 0 and at most 60, e.g. 5")
    )


class GuardConfig(Section):
    guard: GuardSection = Field(default_factory=GuardSection)
    # no URL: the memory in [guard] state_dir (SQLite), one guard's own; a PostgreSQL URL: the memory
    # the guards of every login node share (the cap holds across them; docs/guard.md). Its lease_s
    # is the daemons' and means nothing here.
    store: StoreSection = Field(default_factory=StoreSection)
    slurm: GuardSlurmSection = Field(default_factory=GuardSlurmSection)
    quarantine: SharedQuarantineSection = Field(default_factory=SharedQuarantineSection)
    logging: LoggingSection = Field(default_factory=LoggingSection)


def load_guard_config(path: str | os.PathLike[str] | None) -> GuardConfig:
    """Read and check ``guard.toml``; ``None`` gives every default."""
    if path is None:
        return GuardConfig()
    file = Path(path)
    return _validate(GuardConfig, _read_toml(file), file)
