"""The daemon's own config, ``supervisor.toml``. Every section and key has a default."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr, ValidationInfo, field_validator

from supervisor.config._shared import FloatField, Section, absolute, not_empty
from supervisor.config.errors import fail, fix_hint
from supervisor.config.ingest_section import IngestSection
from supervisor.config.store_section import StoreSection
from supervisor.domain.health.findings import Severity
from supervisor.domain.health.gpu_table import GpuHealthSettings


def _resolve_path(value: Any, info: ValidationInfo) -> Any:
    value = not_empty(value)
    return absolute(value, info) if isinstance(value, str) else value


# systemd's watchdog and the daemon's loop. systemd/slurm-supervisor@.service sets WatchdogSec=60.
# The daemon feeds the watchdog from its own timer every WatchdogSec/2, but only while its loop has
# shown progress (a tick starting or ending, a Slurm command starting or returning) within
# LOOP_STALL_LIMIT_S: a loop stuck for good is restarted by systemd at most
# LOOP_STALL_LIMIT_S + WatchdogSec (3 minutes) after its last sign of life. So no single wait of a
# healthy loop may come near the limit: the wait between ticks (daemon.poll_interval_s) and one
# Slurm command (slurm.command_timeout_s) may each take at most half of it; the other half is for
# the work between two signs (log reading, node probes bounded by probe.timeout_s, the store).
# A drop-in may change WatchdogSec: this limit does not depend on it (only the time to a restart does).
LOOP_STALL_LIMIT_S = 120.0  # 2 × WatchdogSec
LONGEST_WAIT_S = LOOP_STALL_LIMIT_S / 2


def _fits_the_watchdog(value: float, key: str, what: str) -> float:
    if value > LONGEST_WAIT_S:
        raise fail(
            f"a {what} this long would get the daemon killed by systemd's watchdog: the loop must show "
            f"progress at least every {LOOP_STALL_LIMIT_S:g} s, and one {what} may take at most half of that",
            f"set {key} to {LONGEST_WAIT_S:g} or less",
        )
    return value


STATE_ROOT = Path("/var/lib/slurm-supervisor")  # the instances' state directories lie below
RUNTIME_ROOT = Path("/run/slurm-supervisor")  # ... and their runtime directories (API sockets)


class DaemonSection(Section):
    state_dir: Path = STATE_ROOT
    poll_interval_s: FloatField = Field(
        default=5.0, ge=0.2, le=600, json_schema_extra=fix_hint("set seconds between 0.2 and 60, e.g. 5.0")
    )
    # None: node changes only through the node guard ([guard] socket). true: also without a guard, by
    # the instance's own scontrol (its account must hold node rights). false: never; nodes are excluded.
    may_change_nodes: StrictBool | None = None
    max_drains_per_hour: StrictInt = Field(
        default=8, ge=0, json_schema_extra=fix_hint("set a non-negative number; 0 means never drain")
    )
    max_drains_per_run_per_hour: StrictInt = Field(
        default=4, ge=0, json_schema_extra=fix_hint("set a non-negative number; 0 means never drain for a run")
    )
    # A run that cannot be placed (too few usable nodes) is in the logbook at once and pages after this.
    stuck_page_after_s: FloatField = Field(
        default=1800.0, ge=0, json_schema_extra=fix_hint("set seconds, e.g. 1800 (0: page at once)")
    )

    @field_validator("state_dir", mode="before")
    @classmethod
    def _resolve(cls, value: Any, info: ValidationInfo) -> Any:
        return _resolve_path(value, info)

    @field_validator("poll_interval_s")
    @classmethod
    def _poll_fits_the_watchdog(cls, value: float) -> float:
        return _fits_the_watchdog(value, "poll_interval_s", "wait between ticks")

    @property
    def stall_limit_s(self) -> float:
        """How long the loop may show no progress before the watchdog is no longer fed."""
        return LOOP_STALL_LIMIT_S


class SlurmSection(Section):
    slurm_conf: Path | None = None
    bin_dir: Path | None = None
    command_timeout_s: FloatField = Field(
        default=20.0, gt=0, le=600, json_schema_extra=fix_hint("set seconds above 0 and at most 60, e.g. 20.0")
    )

    @field_validator("slurm_conf", "bin_dir", mode="before")
    @classmethod
    def _resolve(cls, value: Any, info: ValidationInfo) -> Any:
        return _resolve_path(value, info)

    @field_validator("slurm_conf")
    @classmethod
    def _conf_is_a_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise fail(f"{value} is not a file", "point it at slurm.conf, or remove it to use Slurm's default")
        return value

    @field_validator("command_timeout_s")
    @classmethod
    def _timeout_fits_the_watchdog(cls, value: float) -> float:
        return _fits_the_watchdog(value, "command_timeout_s", "Slurm command")

    @field_validator("bin_dir")
    @classmethod
    def _bin_dir_is_a_folder(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_dir():
            raise fail(f"{value} is not a folder", "point it at the folder holding sbatch, or remove it to use PATH")
        return value

    def command(self, name: str) -> str:
        """The executable for a Slurm client such as ``sbatch``: in bin_dir, else found on PATH."""
        return str(self.bin_dir / name) if self.bin_dir else name

    def environment(self) -> dict[str, str]:
        """Variables to add to the Slurm clients' environment."""
        return {"SLURM_CONF": str(self.slurm_conf)} if self.slurm_conf else {}


class ProbeSection(Section):
    enabled: StrictBool = True
    timeout_s: FloatField = Field(
        default=1.0, gt=0, le=60, json_schema_extra=fix_hint("set seconds above 0 and at most 60, e.g. 1.0")
    )
    confirm_after_s: FloatField = Field(
        default=1.0, ge=0, le=3600, json_schema_extra=fix_hint("set seconds from 0 to 3600, e.g. 1.0")
    )
    # slurmd's port where Slurm's read gives none; unset, such a node is not probed (no guessed 6818).
    slurmd_port: StrictInt | None = Field(
        default=None, ge=1, le=65535, json_schema_extra=fix_hint("set slurm.conf's SlurmdPort, e.g. 6818")
    )


class HangSection(Section):
    """Hang detection from the job's training log (issue 4): no new step for too long."""

    enabled: StrictBool = True
    multiple: FloatField = Field(
        default=5.0, ge=1.5, le=100, json_schema_extra=fix_hint("set a multiple of the step interval, e.g. 5")
    )
    floor_s: FloatField = Field(
        default=120.0, ge=1, le=86400, json_schema_extra=fix_hint("set seconds from 1 to 86400, e.g. 120")
    )
    cap_s: FloatField = Field(
        default=1800.0, ge=1, le=86400, json_schema_extra=fix_hint("set seconds from 1 to 86400, e.g. 1800")
    )
    startup_grace_s: FloatField = Field(
        default=1800.0, ge=1, le=86400, json_schema_extra=fix_hint("set seconds from 1 to 86400, e.g. 1800")
    )
    pause_cap_s: FloatField = Field(
        default=3600.0, ge=1, le=86400, json_schema_extra=fix_hint("set seconds from 1 to 86400, e.g. 3600")
    )


class StacksSection(Section):
    """Every rank's Python stacks, captured before a hung job is cancelled (issue 35, docs/hang-stacks.md)."""

    enabled: StrictBool = True
    deadline_s: FloatField = Field(
        default=25.0,
        ge=3,
        le=60,
        json_schema_extra=fix_hint("set seconds from 3 to 60, e.g. 25: the cancel waits this long at most"),
    )
    native: StrictBool = False  # py-spy --native: C/C++ frames too (slower, larger)
    # py-spy on the compute nodes; empty: the one beside the daemon's interpreter, else py-spy on PATH
    py_spy: StrictStr = ""
    keep: StrictInt = Field(
        default=20, ge=1, le=1000, json_schema_extra=fix_hint("set how many captures a run keeps, e.g. 20")
    )
    max_file_bytes: StrictInt = Field(
        default=8 << 20, ge=1 << 16, le=1 << 30, json_schema_extra=fix_hint("set bytes from 65536 to 1073741824")
    )
    max_rank_bytes: StrictInt = Field(
        default=64 << 10, ge=4096, le=16 << 20, json_schema_extra=fix_hint("set bytes from 4096 to 16777216")
    )


class HealthSection(Section):
    """Node findings from agents and hooks, and agent heartbeats (issue 3)."""

    heartbeat_timeout_s: FloatField = Field(
        default=15.0,
        ge=1,
        le=3600,
        json_schema_extra=fix_hint("set seconds from 1 to 3600, e.g. 3 × the agent interval"),
    )
    heartbeat_startup_grace_s: FloatField = Field(
        default=120.0, ge=0, le=86400, json_schema_extra=fix_hint("set seconds from 0 to 86400, e.g. 120")
    )
    finding_ttl_s: FloatField = Field(
        default=3600.0, ge=1, le=7 * 86400, json_schema_extra=fix_hint("set seconds from 1 to 604800, e.g. 3600")
    )


class QuarantineSection(Section):
    """Bad-node memory across runs: repeat offenders are kept out of every run for a while."""

    faults: StrictInt = Field(
        default=2, ge=1, json_schema_extra=fix_hint("set how many faults quarantine a node, e.g. 2")
    )
    window_h: FloatField = Field(
        default=168.0, gt=0, json_schema_extra=fix_hint("set hours above 0, e.g. 168 (a week)")
    )
    base_h: FloatField = Field(default=24.0, gt=0, json_schema_extra=fix_hint("set hours above 0, e.g. 24"))
    max_h: FloatField = Field(default=720.0, gt=0, json_schema_extra=fix_hint("set hours above 0, e.g. 720 (30 days)"))
    # A run that cannot be placed without quarantined nodes that Slurm has in service: use the
    # least-bad of them (on record in the logbook), or wait for other nodes (also on record).
    when_short: Literal["use-least-bad", "wait"] = "use-least-bad"


class NotifySection(Section):
    """Paging through a webhook (Slack or PagerDuty Events v2) for page-worthy logbook events."""

    webhook_url_file: Path | None = None
    format: Literal["slack", "pagerduty"] = "slack"
    routing_key_file: Path | None = None
    kinds: tuple[
        Literal["gave_up", "mass_fault", "checkpoint_stale", "repeated_rollbacks", "rollback_blocked", "slowdown"], ...
    ] = ("gave_up", "mass_fault", "checkpoint_stale", "repeated_rollbacks", "rollback_blocked", "slowdown")
    rollbacks: StrictInt = Field(default=3, ge=1)
    rollback_window_s: FloatField = Field(default=86400.0, gt=0)
    timeout_s: FloatField = Field(default=5.0, gt=0, le=120)
    retries: StrictInt = Field(default=3, ge=0, le=20)

    @field_validator("webhook_url_file", "routing_key_file", mode="before")
    @classmethod
    def _resolve(cls, value: Any, info: ValidationInfo) -> Any:
        return _resolve_path(value, info)


class GpuHealthSection(Section):
    """Thresholds of the GPU-health rules (docs/node-agent.md)."""

    persist_samples: StrictInt = Field(default=3, ge=1)
    clear_samples: StrictInt = Field(default=5, ge=1)
    slowdown_samples: StrictInt = Field(default=6, ge=1)
    retired_pages_max: StrictInt = Field(default=60, ge=1)
    ecc_corrected_burst: StrictInt = Field(default=1000, ge=1)
    nvlink_error_burst: StrictInt = Field(default=100, ge=1)
    temp_watch_c: StrictInt = Field(default=90, ge=1, le=200)
    host_mem_watch_pct: FloatField = Field(default=95.0, gt=0, le=100)
    expected_gpus: StrictInt = Field(default=0, ge=0)
    xid_overrides: dict[str, Literal["fatal", "degraded", "watch"]] = Field(
        default_factory=dict, json_schema_extra=fix_hint('write a table of XID = severity, e.g. { "31" = "degraded" }')
    )
    xid_ignore: tuple[StrictInt, ...] = ()

    @field_validator("xid_overrides")
    @classmethod
    def _xids(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if not k.isdigit()]
        if bad:
            raise fail(f"{bad[0]!r} is not an XID number", 'write the XID as a quoted number, e.g. "79" = "fatal"')
        return value

    def to_settings(self) -> GpuHealthSettings:
        values = self.model_dump(exclude={"xid_overrides", "xid_ignore"})
        return GpuHealthSettings(
            **values,
            xid_overrides={int(k): Severity(v) for k, v in self.xid_overrides.items()},
            xid_ignore=frozenset(self.xid_ignore),
        )


_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class FenceSection(Section):
    command: tuple[StrictStr, ...] = Field(
        default=(),
        json_schema_extra=fix_hint('write an argv array, e.g. ["ipmitool", "-H", "{node}-bmc", "power", "off"]'),
    )

    @field_validator("command")
    @classmethod
    def _template(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if value and not value[0].strip():
            raise fail("the program name is empty", 'start with the program, e.g. ["ipmitool", ...]')
        unknown = sorted({name for arg in value for name in _PLACEHOLDER.findall(arg)} - {"node"})
        if unknown:
            raise fail(f"{{{unknown[0]}}} would be passed as is; only {{node}} is substituted", "use {node}")
        return value

    def argv(self, node: str) -> tuple[str, ...]:
        """The fence command for one node, ``{node}`` replaced; empty when none is configured."""
        return tuple(arg.replace("{node}", node) for arg in self.command)


class ApiSection(Section):
    """The instance's local API, a Unix socket the CLI asks (docs/operations.md): callers are
    identified by the kernel (SO_PEERCRED); the rules name who may act on which run."""

    # Default: /run/slurm-supervisor/NAME/api.sock for state_dir /var/lib/slurm-supervisor/NAME
    # (the template unit's RuntimeDirectory=), else STATE_DIR/api.sock (reachable by the account only).
    socket: Path | None = None
    # Members may submit and act on every run of the instance. Default: the group named like the
    # instance's account, if there is one (a team account's group; a person's own group).
    group: StrictStr | None = Field(default=None, min_length=1)
    # Members may read and act on every run (cancel, note, clear a quarantine) but not submit.
    admin_group: StrictStr | None = Field(default=None, min_length=1)

    @field_validator("socket", mode="before")
    @classmethod
    def _resolve(cls, value: Any, info: ValidationInfo) -> Any:
        return _resolve_path(value, info)

    def socket_path(self, state_dir: Path | str) -> Path:
        """Where the socket is: configured, or in the state directory's runtime twin."""
        if self.socket is not None:
            return self.socket
        try:
            below = Path(state_dir).relative_to(STATE_ROOT)
        except ValueError:
            return Path(state_dir) / "api.sock"
        return RUNTIME_ROOT / below / "api.sock"


class GuardSection(Section):
    """The node guard (docs/guard.md). With a socket, node changes go through the guard (no node
    rights of the instance's own) and the guard's shared quarantine joins this instance's."""

    socket: Path | None = None
    timeout_s: FloatField = Field(
        default=15.0, gt=0, le=LONGEST_WAIT_S, json_schema_extra=fix_hint("set seconds above 0 and at most 60, e.g. 15")
    )

    @field_validator("socket", mode="before")
    @classmethod
    def _resolve(cls, value: Any, info: ValidationInfo) -> Any:
        return _resolve_path(value, info)


class LoggingSection(Section):
    level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    format: Literal["auto", "json", "console"] = "auto"

    @field_validator("level", "format", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value


class DaemonConfig(Section):
    """The whole ``supervisor.toml``."""

    daemon: DaemonSection = Field(default_factory=DaemonSection)
    slurm: SlurmSection = Field(default_factory=SlurmSection)
    probe: ProbeSection = Field(default_factory=ProbeSection)
    fence: FenceSection = Field(default_factory=FenceSection)
    hang: HangSection = Field(default_factory=HangSection)
    stacks: StacksSection = Field(default_factory=StacksSection)
    health: HealthSection = Field(default_factory=HealthSection)
    quarantine: QuarantineSection = Field(default_factory=QuarantineSection)
    ingest: IngestSection = Field(default_factory=IngestSection)
    gpu_health: GpuHealthSection = Field(default_factory=GpuHealthSection)
    notify: NotifySection = Field(default_factory=NotifySection)
    logging: LoggingSection = Field(default_factory=LoggingSection)
    guard: GuardSection = Field(default_factory=GuardSection)
    api: ApiSection = Field(default_factory=ApiSection)
    store: StoreSection = Field(default_factory=StoreSection)

    @property
    def may_change_nodes(self) -> bool:
        """Whether the supervisor sets nodes DOWN or DRAIN at all (``[daemon] may_change_nodes``)."""
        chosen = self.daemon.may_change_nodes
        return chosen if chosen is not None else self.guard.socket is not None
