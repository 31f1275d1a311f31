"""The run spec file, ``RUN.toml``: what to run, where spares come from, how to restart."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import hostlist
from pydantic import Field, StrictInt, StrictStr, ValidationInfo, field_validator, model_validator

from supervisor.config._shared import FloatField, Section, absolute, base_dir, missing_path_fix, not_empty
from supervisor.config.continuation_section import ContinuationSection, check_prequeue, exit_code_map
from supervisor.config.errors import fail, fix_hint
from supervisor.config.restart_section import RestartSection
from supervisor.config.sbatch_options import check_sbatch_args, check_script_directives
from supervisor.domain.run import CheckpointPolicy, RunSpec, SparePolicy, SpikePolicy, Trust

# --------------------------------------------------------------------------- sections
# [restart] (restart mode, in-allocation hot spares, pacing) is in ``restart_section``.

_NAME = r"^[a-z0-9][a-z0-9._-]{0,62}$"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Variables that steer how programs are found and loaded, or what Slurm and the supervisor do: the
# job's environment is the spec's to set, these are not (SLURM_* also covers SLURM_CONF and the
# supervisor's own SLURM_SUPERVISOR_*).
_RESERVED_ENV = re.compile(r"^(LD_.*|PATH|PYTHON.*|SLURM_.*|SBATCH_.*)$")
# The daemon's own folders as the shipped unit makes them (StateDirectory=, ConfigurationDirectory=,
# RuntimeDirectory=): no file of a run may lie inside them. A caller that knows the configured
# ones adds them (``context={"daemon_dirs": [...]}``).
DEFAULT_DAEMON_DIRS = ("/var/lib/slurm-supervisor", "/etc/slurm-supervisor", "/run/slurm-supervisor")


def inside(path: str | os.PathLike[str], folders: Iterable[str | os.PathLike[str]]) -> str | None:
    """The folder of ``folders`` that ``path`` lies in (symlinks resolved on both sides), if any."""
    real = os.path.realpath(path)
    for folder in folders:
        top = os.path.realpath(folder)
        if os.path.commonpath([real, top]) == top:
            return str(folder)
    return None


def _daemon_dirs(info: ValidationInfo) -> tuple[str, ...]:
    context = info.context if isinstance(info.context, Mapping) else {}
    return (*DEFAULT_DAEMON_DIRS, *(str(d) for d in context.get("daemon_dirs", ())))


def _outside_daemon_dirs(path: Path, info: ValidationInfo) -> Path:
    folder = inside(path, _daemon_dirs(info))
    if folder is not None:
        raise fail(
            f"{path} is inside the supervisor's own folder {folder}, where its database, tokens and secrets live",
            "choose a path of the run's own (the job's filesystem), outside the supervisor's folders",
        )
    return path


class RunSection(Section):
    name: StrictStr = Field(
        pattern=_NAME,
        json_schema_extra=fix_hint(
            'use 1-63 characters: lowercase letters, digits, ".", "_", "-", starting with a letter or digit,'
            ' e.g. name = "llama-70b"'
        ),
    )
    script: StrictStr = Field(json_schema_extra=fix_hint('name the batch script, e.g. script = "train.sbatch"'))
    partition: StrictStr = Field(
        min_length=1,
        json_schema_extra=fix_hint('name a Slurm partition, e.g. partition = "gpu" (sinfo -s lists them)'),
    )
    nodes: StrictInt = Field(ge=1, json_schema_extra=fix_hint("set the number of nodes the job needs, e.g. nodes = 16"))
    sbatch_args: tuple[StrictStr, ...] = Field(
        default=(), json_schema_extra=fix_hint('write an array of strings, e.g. ["--time=48:00:00"]')
    )
    env: dict[StrictStr, StrictStr] = Field(
        default_factory=dict, json_schema_extra=fix_hint('write a table of strings, e.g. { NCCL_DEBUG = "WARN" }')
    )
    output: StrictStr | None = None
    workdir: StrictStr | None = Field(default=None, validate_default=True)

    @field_validator("script", "output", "workdir", mode="before")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        return not_empty(value)

    @field_validator("script")
    @classmethod
    def _script_is_a_file(cls, value: str, info: ValidationInfo) -> str:
        path = absolute(value, info)
        if not path.exists():
            raise fail(f"the batch script {path} does not exist", missing_path_fix(value, "script"))
        if not path.is_file():
            raise fail(f"{path} is not a file", "point script at the batch script itself")
        try:
            check_script_directives(path)
        except OSError as error:
            raise fail(f"cannot read {path} ({error.strerror})", "let the supervisor's user read it") from None
        return str(path)

    @field_validator("sbatch_args")
    @classmethod
    def _sbatch_args(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return check_sbatch_args(value)

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not _ENV_NAME.match(name):
                raise fail(f"{name!r} is not a valid environment variable name", "use letters, digits and '_' only")
            if _RESERVED_ENV.match(name):
                raise fail(
                    "may not be set by a run spec: it steers how programs are found and loaded, or what"
                    " Slurm and the supervisor do (LD_*, PATH, PYTHON*, SLURM_*, SBATCH_* are refused)",
                    "remove it; set it in the batch script if the job needs it",
                    at=name,
                    value=text,
                )
            if "\0" in text:
                raise fail("holds a NUL character, which no environment variable can", "remove it", at=name, value=text)
        return value

    @field_validator("output")
    @classmethod
    def _output_folder_exists(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        path = _outside_daemon_dirs(absolute(value, info), info)
        if "%" not in str(path.parent) and not path.parent.is_dir():
            raise fail(
                f"the folder {path.parent} does not exist; Slurm will not create it and the job would fail",
                f"create it (mkdir -p {path.parent}) or change output",
            )
        return str(path)

    @field_validator("workdir")
    @classmethod
    def _workdir_is_a_folder(cls, value: str | None, info: ValidationInfo) -> str:
        path = base_dir(info) if value is None else absolute(value, info)
        if not path.is_dir():
            raise fail(f"the folder {path} does not exist", missing_path_fix(value or ".", "folder"))
        return str(_outside_daemon_dirs(path, info))


class SparesSection(Section):
    policy: SparePolicy = SparePolicy.PARTITION_IDLE
    nodes: StrictStr | None = Field(default=None, validate_default=True)

    @field_validator("nodes")
    @classmethod
    def _nodes_match_policy(cls, value: str | None, info: ValidationInfo) -> str | None:
        policy = info.data.get("policy")
        if policy is SparePolicy.NAMED and value is None:
            raise fail('policy = "named" needs the spare nodes', 'add nodes = "gpu-[120-127]" under [spares]')
        if policy is SparePolicy.PARTITION_IDLE and value is not None:
            raise fail(
                'nodes is only used with policy = "named"',
                'remove nodes, or set policy = "named" to use exactly these spares',
            )
        if value is not None:
            expand_hostlist(value)
        return value

    def expanded(self) -> tuple[str, ...]:
        """The spare nodes, one name each."""
        return tuple(expand_hostlist(self.nodes)) if self.nodes else ()


def expand_hostlist(nodes: str) -> list[str]:
    """A Slurm hostlist such as ``gpu-[1-4,9]`` as names; raises a config error when malformed."""
    try:
        names: list[str] = hostlist.expand_hostlist(nodes)
    except hostlist.BadHostlist as error:
        raise fail(
            f"not a valid Slurm hostlist ({error})",
            'write it as Slurm does, e.g. "gpu-[120-127]" or "gpu-[1-4,9],gpu-12" (check: scontrol show hostnames)',
        ) from None
    if not names:
        raise fail("names no nodes", 'list at least one node, e.g. "gpu-[120-127]"')
    return names


class CheckpointsSection(Section):
    root: StrictStr = Field(
        json_schema_extra=fix_hint(
            'give the checkpoint root, e.g. root = "s3://ckpt-bucket/llama-70b/" or root = "/lustre/llama-70b/ckpt"'
        )
    )
    endpoint_url: StrictStr | None = Field(
        default=None, json_schema_extra=fix_hint('give the S3 endpoint, e.g. endpoint_url = "https://s3.example.org"')
    )
    region: StrictStr | None = None
    full_verify: bool = True
    bandwidth_mb_s: FloatField | None = Field(
        default=200.0,
        gt=0,
        json_schema_extra=fix_hint(
            "set a positive number of MB/s for background full verification, e.g. bandwidth_mb_s = 200"
        ),
    )
    scan_interval_s: FloatField = Field(
        default=60.0,
        ge=1,
        json_schema_extra=fix_hint(
            "set how often the root is listed, in seconds (at least 1), e.g. scan_interval_s = 60"
        ),
    )
    upload_grace_s: FloatField = Field(
        default=900.0,
        ge=0,
        json_schema_extra=fix_hint(
            "set the seconds an upload may take before a checkpoint without its manifest counts as torn"
        ),
    )
    expected_interval_s: FloatField | None = Field(
        default=None,
        gt=0,
        json_schema_extra=fix_hint("set the run's checkpoint interval in seconds, e.g. expected_interval_s = 3600"),
    )
    alarm_intervals: FloatField = Field(
        default=3.0,
        ge=1,
        json_schema_extra=fix_hint(
            "set how many expected intervals without a verified checkpoint raise the alarm (at least 1)"
        ),
    )
    allow_adopted: bool = True
    trust: Trust = Trust.OWNER
    resume_file: StrictStr | None = None
    save_on_failure_s: FloatField = Field(
        default=0.0,
        ge=0,
        le=3600,
        json_schema_extra=fix_hint(
            "set the seconds the trainer's surviving ranks need to save after a rank fails (0: they do not save), "
            "e.g. save_on_failure_s = 120"
        ),
    )

    @field_validator("root")
    @classmethod
    def _root(cls, value: str, info: ValidationInfo) -> str:
        if "://" in value:
            scheme = value.split("://", 1)[0]
            if scheme != "s3":
                raise fail(
                    f"the storage scheme {scheme!r} is not supported",
                    'use "s3://bucket/prefix/" for S3-compatible storage or an absolute directory',
                )
            if not value[5:].split("/", 1)[0]:
                raise fail("names no bucket", 'write it as "s3://bucket/prefix/"')
            return value if value.endswith("/") else value + "/"
        return str(_outside_daemon_dirs(absolute(value, info), info))

    @field_validator("resume_file")
    @classmethod
    def _resume_file(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        path = _outside_daemon_dirs(absolute(value, info), info)
        if not path.parent.is_dir():
            raise fail(
                f"the folder {path.parent} does not exist",
                f"create it (mkdir -p {path.parent}) on a filesystem the job's nodes can read",
            )
        return str(path)

    def to_policy(self) -> CheckpointPolicy:
        return CheckpointPolicy(**self.model_dump())


class SpikesSection(Section):
    rollback: bool = True
    heal_window_steps: StrictInt = Field(
        default=200,
        ge=1,
        json_schema_extra=fix_hint(
            "set the steps a spike may take to heal before it is rolled back, e.g. heal_window_steps = 200"
        ),
    )
    min_steps_before: StrictInt = Field(
        default=100,
        ge=0,
        json_schema_extra=fix_hint(
            "set how many steps before the onset the checkpoint must lie, e.g. min_steps_before = 100"
        ),
    )
    skip_batches: StrictInt = Field(
        default=300,
        ge=0,
        json_schema_extra=fix_hint("set the iterations skipped after the restart step, e.g. skip_batches = 300"),
    )
    max_rollbacks: StrictInt = Field(
        default=3,
        ge=0,
        json_schema_extra=fix_hint(
            "set the automatic rollbacks allowed per window, e.g. max_rollbacks = 3 (0: always page)"
        ),
    )
    window_h: FloatField = Field(default=24.0, gt=0, json_schema_extra=fix_hint("set hours above 0, e.g. 24"))
    lr_scale_repeat: FloatField = Field(
        default=0.5, gt=0, le=1, json_schema_extra=fix_hint("set a factor in (0, 1], e.g. 0.5 (1: never lower the LR)")
    )

    def to_policy(self) -> SpikePolicy:
        return SpikePolicy(**self.model_dump())


class RunFile(Section):
    """The whole ``RUN.toml``; its paths are absolute once validated."""

    run: RunSection
    spares: SparesSection = Field(default_factory=SparesSection)
    restart: RestartSection = Field(default_factory=RestartSection)
    checkpoints: CheckpointsSection | None = None
    spikes: SpikesSection = Field(default_factory=SpikesSection)
    continuation: ContinuationSection | None = None

    @model_validator(mode="after")
    def _prequeue(self) -> RunFile:
        if self.continuation is not None:
            resume_file = self.checkpoints.resume_file if self.checkpoints else None
            check_prequeue(self.continuation, self.run.sbatch_args, resume_file)
        return self

    def to_run_spec(self) -> RunSpec:
        run, restart = self.run, self.restart
        return RunSpec(
            name=run.name,
            script=run.script,
            partition=run.partition,
            nodes=run.nodes,
            sbatch_args=run.sbatch_args,
            env=dict(run.env),
            output=run.output,
            workdir=run.workdir,
            spare_policy=self.spares.policy,
            spare_nodes=self.spares.expanded(),
            max_restarts=restart.max_restarts,
            do_not_restart_exit_codes=frozenset(restart.do_not_restart_exit_codes),
            exit_codes=exit_code_map(restart.exit_codes),
            continuation=self.continuation.to_policy(run.sbatch_args) if self.continuation else None,
            restart_mode=restart.mode,
            pacing=restart.pacing(),
            checkpoints=self.checkpoints.to_policy() if self.checkpoints else None,
            spikes=self.spikes.to_policy(),
            hot_spares=restart.hot_spares,
            launcher_timeout_s=restart.launcher_timeout_s,
        )
