"""The Slurm hooks' config, ``hooks.toml`` (default ``/etc/slurm-supervisor/hooks.toml``).

Hooks run as root under slurmd on every compute node; every key has a default, so a node without
the file still gets its NVML check and acts locally (exit code, scontrol); only reporting to the
daemon needs ``url`` and ``token_file``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, StrictInt, StrictStr, ValidationInfo, field_validator

from supervisor.config._shared import FloatField, Section, absolute, not_empty
from supervisor.config.daemon_file import GpuHealthSection
from supervisor.config.errors import fix_hint


class HooksSection(Section):
    url: StrictStr | None = Field(
        default=None,
        pattern=r"^https?://",
        json_schema_extra=fix_hint('give the daemon\'s URL, e.g. url = "http://login1:8471"'),
    )
    token_file: Path | None = None
    spool_dir: Path = Path("/var/spool/slurm-supervisor/hooks")
    spool_max: StrictInt = Field(default=200, ge=1, le=100_000)
    nvml_timeout_s: FloatField = Field(
        default=3.0,
        gt=0,
        le=60,
        json_schema_extra=fix_hint(
            "set seconds; keep the prolog under 5 s in all: nvml_timeout_s + post_timeout_s + ~1 s"
        ),
    )
    post_timeout_s: FloatField = Field(default=1.0, gt=0, le=30)
    scontrol: StrictStr = "scontrol"
    nvml_library: Path | None = None

    @field_validator("token_file", "spool_dir", "nvml_library", mode="before")
    @classmethod
    def _resolve(cls, value: Any, info: ValidationInfo) -> Any:
        value = not_empty(value)
        return absolute(value, info) if isinstance(value, str) else value


class HooksConfig(Section):
    hooks: HooksSection = Field(default_factory=HooksSection)
    gpu_health: GpuHealthSection = Field(default_factory=GpuHealthSection)
