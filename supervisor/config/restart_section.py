"""``[restart]`` of the run spec file: how many restarts, which exit codes stop the run, the restart
mode (resubmit, or in-allocation with hot spares — docs/in-allocation.md) and restart pacing.
Split from ``run_file`` to keep modules small."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StrictInt, ValidationInfo, field_validator

from supervisor.config._shared import FloatField, Section
from supervisor.config.continuation_section import exit_code_map
from supervisor.config.errors import fail, fix_hint
from supervisor.domain.run import DEFAULT_DO_NOT_RESTART, ExitMeaning, RestartMode, RestartPacing


class RestartSection(Section):
    max_restarts: StrictInt = Field(
        default=10, ge=0, json_schema_extra=fix_hint("set a non-negative number of restarts")
    )
    do_not_restart_exit_codes: tuple[Annotated[StrictInt, Field(ge=1, le=255)], ...] = Field(
        default=DEFAULT_DO_NOT_RESTART,
        json_schema_extra=fix_hint("list exit codes from 1 to 255, e.g. do_not_restart_exit_codes = [93]"),
    )
    # The run's own exit-code meanings over the defaults (domain.decide.exit_codes): "16" = "restart".
    exit_codes: dict[str, ExitMeaning] = Field(
        default_factory=dict,
        json_schema_extra=fix_hint('map codes to restart, restart-elsewhere, continue or stop, e.g. "17" = "stop"'),
    )
    mode: RestartMode = RestartMode.RESUBMIT
    # In-allocation mode (docs/in-allocation.md): nodes the job holds warm beyond run.nodes, and how
    # long its launcher may stay silent before the run falls back to resubmission.
    hot_spares: StrictInt = Field(
        default=0,
        ge=0,
        le=1024,
        validate_default=True,
        json_schema_extra=fix_hint("set how many hot spares the job holds, e.g. hot_spares = 1"),
    )
    launcher_timeout_s: FloatField = Field(
        default=60.0,
        ge=5,
        le=3600,
        json_schema_extra=fix_hint("set seconds from 5 to 3600, e.g. launcher_timeout_s = 60"),
    )
    # Restart pacing (domain.decide.backoff): attempts that die soon after starting are restarted later
    # and later; a crash loop pauses the run before each restart and pages.
    fast_failure_s: FloatField = Field(
        default=600.0,
        gt=0,
        json_schema_extra=fix_hint("set seconds above 0, e.g. 600 (an attempt that dies sooner failed fast)"),
    )
    backoff_base_s: FloatField = Field(
        default=30.0, gt=0, json_schema_extra=fix_hint("set seconds above 0, e.g. 30 (the first delay; it doubles)")
    )
    backoff_max_s: FloatField = Field(
        default=1800.0, gt=0, json_schema_extra=fix_hint("set seconds, at least backoff_base_s, e.g. 1800")
    )
    crash_loop_after: StrictInt = Field(
        default=6, ge=1, json_schema_extra=fix_hint("set how many fast failures in a row are a crash loop, e.g. 6")
    )
    crash_loop_pause_s: FloatField = Field(
        default=3600.0,
        gt=0,
        json_schema_extra=fix_hint("set seconds above 0, e.g. 3600 (the wait before each restart)"),
    )

    @field_validator("hot_spares")
    @classmethod
    def _spares_match_mode(cls, value: int, info: ValidationInfo) -> int:
        mode = info.data.get("mode")
        if mode is RestartMode.IN_ALLOCATION and value < 1:
            raise fail(
                'mode = "in-allocation" needs at least one hot spare to swap in',
                'set hot_spares = 1 (or more) under [restart], or use mode = "resubmit"',
            )
        if mode is not RestartMode.IN_ALLOCATION and value > 0:
            raise fail(
                'hot_spares is only used with mode = "in-allocation"',
                'remove hot_spares, or set mode = "in-allocation" under [restart]',
            )
        return value

    @field_validator("exit_codes")
    @classmethod
    def _codes_are_numbers(cls, value: dict[str, ExitMeaning]) -> dict[str, ExitMeaning]:
        exit_code_map(value)  # raises, naming the key, for one that is not a code
        return value

    @field_validator("backoff_max_s")
    @classmethod
    def _max_not_below_base(cls, value: float, info: ValidationInfo) -> float:
        base = info.data.get("backoff_base_s")
        if base is not None and value < base:
            raise ValueError(f"must be at least backoff_base_s ({base:g})")
        return value

    def pacing(self) -> RestartPacing:
        return RestartPacing(
            fast_failure_s=self.fast_failure_s,
            base_s=self.backoff_base_s,
            max_s=self.backoff_max_s,
            crash_loop_after=self.crash_loop_after,
            crash_loop_pause_s=self.crash_loop_pause_s,
        )
