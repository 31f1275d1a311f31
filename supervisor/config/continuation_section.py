"""``[continuation]`` of the run spec file: how the run's jobs end on purpose before a partition's
time limit (domain.decide.continuation), and ``[restart.exit_codes]``, the run's own exit-code
meanings (domain.decide.exit_codes). Split from ``run_file`` to keep modules small."""

from __future__ import annotations

import re

from pydantic import Field, StrictBool, StrictInt, field_validator

from supervisor.config._shared import Section
from supervisor.config.errors import fail, fix_hint
from supervisor.domain.run import DEFAULT_CONTINUE_EXIT_CODE, ContinuationPolicy, ExitMeaning

# The names Slurm's --signal takes (without SIG), or a number; the trainer traps the same one.
_SIGNAL = re.compile(r"^(USR1|USR2|TERM|INT|HUP|QUIT|ALRM|URG|CONT|[1-9][0-9]?)$")


class ContinuationSection(Section):
    signal: str | None = Field(
        default="USR1", json_schema_extra=fix_hint('name the signal without SIG, e.g. signal = "USR1"')
    )
    lead_s: StrictInt = Field(
        default=600,
        ge=60,
        le=65535,
        json_schema_extra=fix_hint("set whole seconds from 60 to 65535 before the limit, e.g. lead_s = 600"),
    )
    batch_shell: StrictBool = True
    exit_code: StrictInt = Field(
        default=DEFAULT_CONTINUE_EXIT_CODE,
        ge=1,
        le=255,
        json_schema_extra=fix_hint("set the trainer's 'saved, continue me' code from 1 to 255, e.g. exit_code = 75"),
    )
    target_step: StrictInt | None = Field(
        default=None,
        ge=1,
        json_schema_extra=fix_hint("set the run's last step (Megatron's --train-iters), e.g. target_step = 500000"),
    )
    max_without_progress: StrictInt = Field(
        default=3,
        ge=1,
        le=100,
        json_schema_extra=fix_hint("set how many continuations in a row may bring no newer checkpoint, e.g. 3"),
    )

    prequeue_s: StrictInt = Field(
        default=0,
        ge=0,
        le=86400,
        json_schema_extra=fix_hint(
            "set whole seconds before the limit to queue the next job, e.g. 1800 (0: at the end)"
        ),
    )
    time_limit_s: StrictInt | None = Field(
        default=None, ge=60, json_schema_extra=fix_hint("set the job's time limit in seconds, e.g. 86400")
    )

    @field_validator("signal")
    @classmethod
    def _known_signal(cls, value: str | None) -> str | None:
        if value is None:
            return None
        name = value.upper().removeprefix("SIG")
        if not _SIGNAL.match(name):
            raise fail(
                f"{value!r} is not a signal Slurm's --signal sends", 'use e.g. signal = "USR1" (or "USR2", "TERM")'
            )
        return name

    def to_policy(self, sbatch_args: tuple[str, ...] = ()) -> ContinuationPolicy:
        return ContinuationPolicy(
            **{**self.model_dump(), "time_limit_s": self.time_limit_s or time_limit_of(sbatch_args)}
        )


def exit_code_map(raw: dict[str, ExitMeaning]) -> dict[int, ExitMeaning]:
    """``[restart.exit_codes]``: TOML keys are strings; each must be an exit code from 1 to 255."""
    out = {}
    for key, meaning in raw.items():
        if not key.isdigit() or not 1 <= int(key) <= 255:
            raise fail(f"exit code {key!r} is not a number from 1 to 255", 'write e.g. "16" = "restart-elsewhere"')
        out[int(key)] = meaning
    return out


def check_prequeue(section: ContinuationSection, sbatch_args: tuple[str, ...], resume_file: str | None) -> None:
    """``prequeue_s`` needs the job's time limit (``time_limit_s``, else the run's ``--time``) and a
    resume file: the successor's environment is fixed before its predecessor's last save."""
    if not section.prequeue_s:
        return
    if resume_file is None:
        raise fail(
            "[continuation] prequeue_s needs [checkpoints] resume_file",
            "the pre-queued job reads its checkpoint there as of its start: set resume_file",
        )
    limit = section.time_limit_s or time_limit_of(sbatch_args)
    if limit is None:
        raise fail("[continuation] prequeue_s needs the job's time limit", "set time_limit_s, or --time in sbatch_args")
    if section.prequeue_s >= limit:
        raise fail("[continuation] prequeue_s is not below the time limit", "set prequeue_s below time_limit_s")


def time_limit_of(sbatch_args: tuple[str, ...]) -> int | None:
    """Seconds of an sbatch ``--time``/``-t`` (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS)."""
    for i, arg in enumerate(sbatch_args):
        if arg.startswith("--time="):
            return _slurm_seconds(arg.split("=", 1)[1])
        if arg in ("--time", "-t") and i + 1 < len(sbatch_args):
            return _slurm_seconds(sbatch_args[i + 1])
    return None


def _slurm_seconds(text: str) -> int | None:
    days, _, rest = text.rpartition("-") if "-" in text else ("0", "", text)
    parts = rest.split(":")
    if not (days.isdigit() and all(p.isdigit() for p in parts)) or len(parts) > 3:
        return None
    nums = [int(p) for p in parts]
    if days != "0" or "-" in text:  # D-HH[:MM[:SS]]
        h, m, s = (nums + [0, 0])[:3]
    else:  # MM, MM:SS, HH:MM:SS
        h, m, s = [0, *nums, 0][:3] if len(nums) <= 2 else nums
    return int(days) * 86400 + h * 3600 + m * 60 + s
