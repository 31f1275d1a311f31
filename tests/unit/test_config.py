"""Config files: a valid spec gives the right RunSpec; every mistake names file, key and fix."""

from __future__ import annotations

import typing
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from supervisor.config import (
    ConfigError,
    DaemonConfig,
    RunFile,
    check_partition,
    load_daemon_config,
    load_run_file,
    load_run_spec,
)
from supervisor.domain.run import RestartMode, RunSpec, SparePolicy

FULL_SPEC = """\
[run]
name = "llama-70b"
script = "train.sbatch"
partition = "gpu"
nodes = 16
sbatch_args = ["--time=48:00:00", "--gpus-per-node=8"]
env = { NCCL_DEBUG = "WARN" }
output = "logs/%x-%j.out"
workdir = "."
[spares]
policy = "named"
nodes = "gpu-[120-127]"
[restart]
max_restarts = 5
do_not_restart_exit_codes = [93, 42]
mode = "requeue"
"""

MINIMAL_RUN = """\
[run]
name = "llama-70b"
script = "train.sbatch"
partition = "gpu"
nodes = 16
"""

SCRIPT = "#!/bin/bash\n#SBATCH --time=1:00:00\n\nsrun python train.py\n"


def write(folder: Path, text: str, name: str = "RUN.toml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


def spec_in(tmp_path: Path, text: str, script: str = SCRIPT) -> Path:
    (tmp_path / "train.sbatch").write_text(script)
    (tmp_path / "logs").mkdir(exist_ok=True)
    return write(tmp_path, text)


def error_of(path: Path, loader: Callable[[Path], object] = load_run_spec) -> str:
    with pytest.raises(ConfigError) as caught:
        loader(path)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    message = str(caught.value)
    assert str(path) in message
    assert "Fix:" in message
    assert "pydantic" not in message and "validation error" not in message.lower()
    return message


def with_run(**keys: str) -> str:
    """MINIMAL_RUN with the given [run] lines replaced or added (values as TOML text)."""
    lines = dict(line.split(" = ", 1) for line in MINIMAL_RUN.splitlines()[1:])
    lines.update(keys)
    return "[run]\n" + "".join(f"{k} = {v}\n" for k, v in lines.items())


# --------------------------------------------------------------------------- valid run specs


def test_full_spec_gives_the_run_spec(tmp_path: Path) -> None:
    spec = load_run_spec(spec_in(tmp_path, FULL_SPEC))
    assert spec == RunSpec(
        name="llama-70b",
        script=str(tmp_path / "train.sbatch"),
        partition="gpu",
        nodes=16,
        sbatch_args=("--time=48:00:00", "--gpus-per-node=8"),
        env={"NCCL_DEBUG": "WARN"},
        output=str(tmp_path / "logs" / "%x-%j.out"),
        workdir=str(tmp_path),
        spare_policy=SparePolicy.NAMED,
        spare_nodes=tuple(f"gpu-{n}" for n in range(120, 128)),
        max_restarts=5,
        do_not_restart_exit_codes=frozenset({93, 42}),
        restart_mode=RestartMode.REQUEUE,
    )


def test_minimal_spec_takes_the_defaults(tmp_path: Path) -> None:
    spec = load_run_spec(spec_in(tmp_path, MINIMAL_RUN))
    assert spec.spare_policy is SparePolicy.PARTITION_IDLE
    assert spec.spare_nodes == ()
    assert spec.max_restarts == 10
    assert spec.do_not_restart_exit_codes == frozenset({93})
    assert spec.restart_mode is RestartMode.RESUBMIT
    assert spec.sbatch_args == () and dict(spec.env) == {} and spec.output is None
    assert spec.workdir == str(tmp_path), "jobs start in the spec's folder, as sbatch run there would"


def test_exit_codes_without_93_are_kept_as_given(tmp_path: Path) -> None:
    text = MINIMAL_RUN + "[restart]\ndo_not_restart_exit_codes = [42]\n"
    assert load_run_spec(spec_in(tmp_path, text)).do_not_restart_exit_codes == frozenset({42})


def test_relative_paths_resolve_against_the_spec_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "train.sbatch").write_text(SCRIPT)
    (tmp_path / "runs" / "out").mkdir(parents=True)
    text = with_run(script='"../scripts/train.sbatch"', output='"out/%j.log"', workdir='".."')
    write(tmp_path / "runs", text)
    monkeypatch.chdir(tmp_path / "scripts")  # somewhere else entirely
    spec = load_run_spec(Path("../runs/RUN.toml"))
    assert spec.script == str(tmp_path / "scripts" / "train.sbatch")
    assert spec.output == str(tmp_path / "runs" / "out" / "%j.log")
    assert spec.workdir == str(tmp_path)


def test_absolute_script_path_is_kept(tmp_path: Path) -> None:
    script = tmp_path / "elsewhere" / "job.sh"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    spec = load_run_spec(write(tmp_path / "spec", with_run(script=f'"{script}"')))
    assert spec.script == str(script)


def test_run_file_model_is_frozen(tmp_path: Path) -> None:
    model = load_run_file(spec_in(tmp_path, MINIMAL_RUN))
    with pytest.raises(ValidationError):
        setattr(model.run, "nodes", 3)  # noqa: B010 - the point is that assignment fails


# --------------------------------------------------------------------------- run spec errors


def test_negative_restarts_reads_like_the_example(tmp_path: Path) -> None:
    path = spec_in(tmp_path, MINIMAL_RUN + "[restart]\nmax_restarts = -1\n")
    expected = "restart.max_restarts = -1: must be >= 0. Fix: set a non-negative number of restarts."
    assert error_of(path) == f"{path}: {expected}"


def test_malformed_toml_gives_line_and_column(tmp_path: Path) -> None:
    path = spec_in(tmp_path, '[run]\nname = "x"\nnodes = sixteen\n')
    message = error_of(path)
    assert "not valid TOML at line 3, column 9" in message
    assert "nodes = sixteen" in message, "the offending line is shown"
    assert "double quotes" in message


def test_missing_file(tmp_path: Path) -> None:
    message = error_of(tmp_path / "nope.toml")
    assert "cannot read the file" in message and "check the path" in message


def test_unknown_key_suggests_the_closest(tmp_path: Path) -> None:
    path = spec_in(tmp_path, MINIMAL_RUN + "[restart]\nmax_restart = 3\n")
    message = error_of(path)
    assert "restart.max_restart: unknown key" in message
    assert "rename it to max_restarts" in message


def test_unknown_section_suggests_the_closest(tmp_path: Path) -> None:
    message = error_of(spec_in(tmp_path, MINIMAL_RUN + "[restrat]\nmode = 'requeue'\n"))
    assert "[restrat]: unknown section" in message and "rename it to [restart]" in message


def test_key_in_the_wrong_section_says_where_it_belongs(tmp_path: Path) -> None:
    message = error_of(spec_in(tmp_path, MINIMAL_RUN + "[spares]\nmax_restarts = 3\n"))
    assert "spares.max_restarts: unknown key" in message and "move it under [restart]" in message


def test_key_before_any_section(tmp_path: Path) -> None:
    message = error_of(spec_in(tmp_path, "max_restarts = 3\n" + MINIMAL_RUN))
    assert "max_restarts: key outside any section" in message and "move it under [restart]" in message


def test_missing_run_section_and_keys(tmp_path: Path) -> None:
    assert "run: is missing. Fix: add a [run] section" in error_of(spec_in(tmp_path, "[restart]\n"))
    message = error_of(spec_in(tmp_path, '[run]\nname = "a"\n'))
    assert "run.script: is missing" in message and 'script = "train.sbatch"' in message
    assert "run.nodes: is missing" in message


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('nodes = "16"', 'run.nodes = "16": must be a whole number, not a string. Fix: set the number of nodes'),
        ("nodes = 0", "run.nodes = 0: must be >= 1"),
        ("nodes = 2.5", "run.nodes = 2.5: must be a whole number, not a decimal number"),
        ('name = "Llama 70B"', 'run.name = "Llama 70B": is not in the allowed form. Fix: use 1-63 characters'),
        ('partition = ""', 'run.partition = "": must not be empty'),
        ('sbatch_args = "--time=1"', 'run.sbatch_args = "--time=1": must be an array, not a string'),
        ("env = { NCCL_DEBUG = 1 }", "run.env.NCCL_DEBUG = 1: must be a string, not an integer. Fix: write a table"),
        ('env = { "NCCL DEBUG" = "1" }', "'NCCL DEBUG' is not a valid environment variable name"),
    ],
)
def test_wrong_types_and_values_in_run(tmp_path: Path, line: str, expected: str) -> None:
    key = line.split(" = ")[0]
    assert expected in error_of(spec_in(tmp_path, with_run(**{key: line.split(" = ", 1)[1]})))


@pytest.mark.parametrize(
    ("restart", "expected"),
    [
        ("do_not_restart_exit_codes = [93, 300]", "restart.do_not_restart_exit_codes[1] = 300: must be <= 255"),
        ("do_not_restart_exit_codes = [0]", "restart.do_not_restart_exit_codes[0] = 0: must be >= 1"),
        ('mode = "again"', 'restart.mode = "again": must be one of "resubmit", "requeue" or "in-allocation"'),
        ('max_restarts = "3"', 'restart.max_restarts = "3": must be a whole number, not a string'),
        ("max_restarts = true", "restart.max_restarts = true: must be a whole number, not a boolean"),
    ],
)
def test_wrong_values_in_restart(tmp_path: Path, restart: str, expected: str) -> None:
    assert expected in error_of(spec_in(tmp_path, MINIMAL_RUN + "[restart]\n" + restart + "\n"))


def test_missing_batch_script(tmp_path: Path) -> None:
    message = error_of(spec_in(tmp_path, with_run(script='"nope.sbatch"')))
    assert f'run.script = "nope.sbatch": the batch script {tmp_path / "nope.sbatch"} does not exist' in message
    assert "Fix: create the script, or correct the path" in message


def test_script_that_is_a_folder(tmp_path: Path) -> None:
    (tmp_path / "job").mkdir()
    assert "is not a file" in error_of(spec_in(tmp_path, with_run(script='"job"')))


def test_tilde_is_not_expanded_and_says_so(tmp_path: Path) -> None:
    assert "'~' is not expanded" in error_of(spec_in(tmp_path, with_run(script='"~/train.sbatch"')))


def test_missing_workdir_and_output_folder(tmp_path: Path) -> None:
    message = error_of(spec_in(tmp_path, with_run(workdir='"nowhere"', output='"missing/%j.out"')))
    assert f'run.workdir = "nowhere": the folder {tmp_path / "nowhere"} does not exist' in message
    assert "run.output" in message and f"mkdir -p {tmp_path / 'missing'}" in message


@pytest.mark.parametrize(
    ("spares", "expected"),
    [
        ('policy = "named"\nnodes = "gpu-[120-"', 'spares.nodes = "gpu-[120-": not a valid Slurm hostlist'),
        ('policy = "named"\nnodes = "gpu-[9-1]"', "not a valid Slurm hostlist"),
        ('policy = "named"', 'spares.nodes: policy = "named" needs the spare nodes. Fix: add nodes = '),
        ('nodes = "gpu-1"', 'spares.nodes = "gpu-1": nodes is only used with policy = "named"'),
        ('policy = "any"', 'spares.policy = "any": must be one of "named" or "partition-idle"'),
    ],
)
def test_spares_errors(tmp_path: Path, spares: str, expected: str) -> None:
    assert expected in error_of(spec_in(tmp_path, MINIMAL_RUN + "[spares]\n" + spares + "\n"))


@pytest.mark.parametrize(
    ("arg", "why"),
    [
        ("--nodes=4", "node count"),
        ("-N4", "node count"),
        ("-N", "node count"),
        ("--partition=gpu", "partition"),
        ("--part=gpu", "partition"),
        ("-p", "partition"),
        ("--exclude=gpu-1", "--exclude from the nodes it found faulty"),
        ("-xgpu-1", "--exclude"),
        ("--job-name=x", "names each job after run.name"),
        ("-J", "names each job"),
        ("--comment=hi", "re-adopt"),
        ("--requeue", "restart.mode"),
        ("--no-requeue", "restart.mode"),
        ("--nodelist=gpu-[1-4]", "pinning breaks requeue"),
        ("-w", "pinning breaks requeue"),
        ("--nodefile=hosts", "pinning breaks requeue"),
    ],
)
def test_sbatch_args_the_supervisor_owns(tmp_path: Path, arg: str, why: str) -> None:
    message = error_of(spec_in(tmp_path, with_run(sbatch_args=f'["--time=1:00:00", "{arg}"]')))
    assert f'run.sbatch_args[1] = "{arg}":' in message
    assert why in message


@pytest.mark.parametrize("arg", ["--exclusive", "--no-kill", "--constraint=h100", "--gpus-per-node=8", "--exclus"])
def test_sbatch_args_that_are_allowed(tmp_path: Path, arg: str) -> None:
    spec = load_run_spec(spec_in(tmp_path, with_run(sbatch_args=f'["{arg}"]')))
    assert spec.sbatch_args == (arg,)


def test_an_abbreviation_sbatch_finds_ambiguous_is_refused(tmp_path: Path) -> None:
    message = error_of(spec_in(tmp_path, with_run(sbatch_args='["--exc"]')))
    assert 'run.sbatch_args[0] = "--exc": --exc is ambiguous to sbatch (--exclude, --exclusive)' in message


def test_script_that_pins_nodes_is_refused(tmp_path: Path) -> None:
    script = "#!/bin/bash\n#SBATCH --time=1:00:00\n#SBATCH -w gpu-[1-4]\nsrun true\n"
    message = error_of(spec_in(tmp_path, MINIMAL_RUN, script=script))
    assert 'line 3 of the script, "#SBATCH -w gpu-[1-4]"' in message and "pinning breaks requeue" in message


def test_sbatch_lines_after_the_first_command_are_ignored(tmp_path: Path) -> None:
    script = "#!/bin/bash\nsrun true\n#SBATCH --nodelist=gpu-1\n"
    assert load_run_spec(spec_in(tmp_path, MINIMAL_RUN, script=script)).nodes == 16


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    text = with_run(nodes="0", name='"BAD"') + "[restart]\nmax_restarts = -1\n"
    with pytest.raises(ConfigError) as caught:
        load_run_spec(spec_in(tmp_path, text))
    assert {p.key for p in caught.value.problems} == {"run.name", "run.nodes", "restart.max_restarts"}
    assert len(str(caught.value).splitlines()) == 3


# --------------------------------------------------------------------------- partitions


def test_check_partition_accepts_known_ones(tmp_path: Path) -> None:
    spec = load_run_spec(spec_in(tmp_path, with_run(partition='"gpu,gpu-low"')))
    check_partition(spec, ["cpu", "gpu*", "gpu-low"])


def test_check_partition_lists_the_known_ones(tmp_path: Path) -> None:
    spec = load_run_spec(spec_in(tmp_path, with_run(partition='"gpus"')))
    with pytest.raises(ConfigError) as caught:
        check_partition(spec, ["gpu*", "cpu"])
    message = str(caught.value)
    assert message.startswith("run llama-70b: run.partition = \"gpus\": Slurm has no partition 'gpus'")
    assert "Fix: set partition to one of: cpu, gpu (did you mean 'gpu'?)" in message


def test_check_partition_with_no_partitions_at_all(tmp_path: Path) -> None:
    spec = load_run_spec(spec_in(tmp_path, MINIMAL_RUN))
    with pytest.raises(ConfigError, match="reaches slurmctld"):
        check_partition(spec, [])


# --------------------------------------------------------------------------- daemon config

FULL_DAEMON = """\
[daemon]
state_dir = "state"
poll_interval_s = 2
may_change_nodes = false
max_drains_per_hour = 0
[slurm]
slurm_conf = "slurm.conf"
bin_dir = "bin"
command_timeout_s = 30.5
[probe]
enabled = false
timeout_s = 0.5
confirm_after_s = 3
[fence]
command = ["ipmitool", "-H", "{node}-bmc", "power", "off"]
[logging]
level = "DEBUG"
format = "json"
"""


def test_no_daemon_config_gives_the_defaults() -> None:
    config = load_daemon_config(None)
    assert config == DaemonConfig()
    assert config.daemon.state_dir == Path("/var/lib/slurm-supervisor")
    assert config.daemon.poll_interval_s == 5.0
    assert config.daemon.may_change_nodes is None and config.may_change_nodes is False  # no guard, no changes
    assert config.daemon.max_drains_per_hour == 8
    assert config.slurm.slurm_conf is None and config.slurm.bin_dir is None
    assert config.slurm.command_timeout_s == 20.0
    assert (config.probe.enabled, config.probe.timeout_s, config.probe.confirm_after_s) == (True, 1.0, 1.0)
    assert config.fence.command == ()
    assert (config.logging.level, config.logging.format) == ("info", "auto")


def test_empty_daemon_file_gives_the_defaults(tmp_path: Path) -> None:
    assert load_daemon_config(write(tmp_path, "", "supervisor.toml")) == DaemonConfig()


def test_full_daemon_config(tmp_path: Path) -> None:
    (tmp_path / "slurm.conf").write_text("ClusterName=test\n")
    (tmp_path / "bin").mkdir()
    config = load_daemon_config(write(tmp_path, FULL_DAEMON, "supervisor.toml"))
    assert config.daemon.state_dir == tmp_path / "state"
    assert config.daemon.poll_interval_s == 2.0 and isinstance(config.daemon.poll_interval_s, float)
    assert config.daemon.may_change_nodes is False and config.daemon.max_drains_per_hour == 0
    assert config.slurm.command("sbatch") == str(tmp_path / "bin" / "sbatch")
    assert config.slurm.environment() == {"SLURM_CONF": str(tmp_path / "slurm.conf")}
    assert config.slurm.command_timeout_s == 30.5
    assert (config.probe.enabled, config.probe.timeout_s, config.probe.confirm_after_s) == (False, 0.5, 3.0)
    assert config.fence.argv("gpu-7") == ("ipmitool", "-H", "gpu-7-bmc", "power", "off")
    assert (config.logging.level, config.logging.format) == ("debug", "json")


def test_slurm_clients_come_from_path_by_default() -> None:
    config = load_daemon_config(None)
    assert config.slurm.command("squeue") == "squeue" and config.slurm.environment() == {}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[daemon]\npoll_interval_s = 0.1", "daemon.poll_interval_s = 0.1: must be >= 0.2. Fix: set seconds between"),
        ("[daemon]\npoll_interval_s = 601", "daemon.poll_interval_s = 601: must be <= 600"),
        ('[daemon]\npoll_interval_s = "5"', "must be a number, not a string. Fix: set seconds"),
        ('[daemon]\nmay_change_nodes = "yes"', 'daemon.may_change_nodes = "yes": must be true or false, not a string'),
        ("[daemon]\nmax_drains_per_hour = -1", "daemon.max_drains_per_hour = -1: must be >= 0"),
        ('[daemon]\nstate_dir = ""', 'daemon.state_dir = "": must not be empty'),
        ("[slurm]\ncommand_timeout_s = 0", "slurm.command_timeout_s = 0: must be > 0"),
        ('[slurm]\nslurm_conf = "/nonexistent/slurm.conf"', "/nonexistent/slurm.conf is not a file"),
        ('[slurm]\nbin_dir = "/nonexistent"', "/nonexistent is not a folder. Fix: point it at the folder holding"),
        ("[probe]\ntimeout = 2", "probe.timeout: unknown key. Fix: rename it to timeout_s"),
        ('[fence]\ncommand = ["ipmitool", "-H", "{host}"]', "{host} would be passed as is; only {node} is"),
        ('[fence]\ncommand = "ipmitool {node}"', 'fence.command = "ipmitool {node}": must be an array'),
        ('[logging]\nlevel = "loud"', 'logging.level = "loud": must be one of "debug", "info"'),
        ('[logging]\nformat = "xml"', 'logging.format = "xml": must be one of "auto", "json" or "console"'),
        ('[ingest]\npeer_urls = ["http://a:1,http://b:2"]', "is not an http(s) URL. Fix: list the other daemons"),
        ('[ingest]\npeer_urls = ["login2:8471"]', "is not an http(s) URL"),
        ("[deamon]\n", "[deamon]: unknown section. Fix: rename it to [daemon]"),
        ("daemon = 3", "daemon = 3: must be a table, not an integer"),
    ],
)
def test_daemon_config_errors(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in error_of(write(tmp_path, text + "\n", "supervisor.toml"), load_daemon_config)


def test_daemon_config_is_frozen() -> None:
    with pytest.raises(ValidationError):
        setattr(load_daemon_config(None).daemon, "poll_interval_s", 1.0)  # noqa: B010


# --------------------------------------------------------------------------- the reference stays complete


def test_every_key_is_documented() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    for root in (RunFile, DaemonConfig):
        for section, field in root.model_fields.items():
            assert f"### `[{section}]`" in doc, section
            model = field.annotation
            if not isinstance(model, type):  # an optional section: X | None
                model = next(a for a in typing.get_args(model) if a is not type(None))
            assert isinstance(model, type)
            for key in model.model_fields:
                assert f"| `{key}` |" in doc, f"{section}.{key} is missing from docs/configuration.md"


# --------------------------------------------------------------------------- [checkpoints]


def test_checkpoints_section_becomes_the_run_specs_policy(tmp_path: Path) -> None:
    (tmp_path / "shared").mkdir()
    spec = load_run_spec(
        spec_in(
            tmp_path,
            MINIMAL_RUN
            + """
[checkpoints]
root = "s3://ckpt/llama-70b"
endpoint_url = "http://127.0.0.1:9000"
expected_interval_s = 3600
bandwidth_mb_s = 50
resume_file = "shared/resume.json"
save_on_failure_s = 90
""",
        )
    )
    policy = spec.checkpoints
    assert policy is not None
    assert policy.root == "s3://ckpt/llama-70b/" and policy.endpoint_url == "http://127.0.0.1:9000"
    assert policy.expected_interval_s == 3600.0 and policy.bandwidth_mb_s == 50.0 and policy.full_verify
    assert policy.resume_file == str(tmp_path / "shared" / "resume.json") and policy.save_on_failure_s == 90.0
    assert load_run_spec(spec_in(tmp_path, MINIMAL_RUN)).checkpoints is None


def test_checkpoint_trust_is_the_owners_by_default_and_survives_the_store(tmp_path: Path) -> None:
    import json

    from supervisor.adapters.store_rows import spec_from_json, spec_to_json
    from supervisor.domain.run import Trust

    spec = load_run_spec(spec_in(tmp_path, MINIMAL_RUN + '[checkpoints]\nroot = "ckpt"\n'))
    assert spec.checkpoints is not None and spec.checkpoints.trust is Trust.OWNER
    strict = load_run_spec(spec_in(tmp_path, MINIMAL_RUN + '[checkpoints]\nroot = "ckpt"\ntrust = "strict"\n'))
    stored = spec_from_json(json.loads(json.dumps(spec_to_json(strict))))
    assert stored.checkpoints is not None and stored.checkpoints.trust is Trust.STRICT


def test_a_posix_checkpoint_root_is_taken_from_the_spec_files_folder(tmp_path: Path) -> None:
    spec = load_run_spec(spec_in(tmp_path, MINIMAL_RUN + '[checkpoints]\nroot = "ckpt"\n'))
    assert spec.checkpoints is not None and spec.checkpoints.root == str(tmp_path / "ckpt")


@pytest.mark.parametrize(
    ("body", "key", "words"),
    [
        ('root = "gs://bucket/x"', "checkpoints.root", "scheme 'gs' is not supported"),
        ('root = "s3:///x"', "checkpoints.root", "names no bucket"),
        ('root = "s3://b/"\nresume_file = "nowhere/resume.json"', "checkpoints.resume_file", "does not exist"),
        ('root = "s3://b/"\nbandwidth_mb_s = 0', "checkpoints.bandwidth_mb_s", "must be > 0"),
        ('root = "s3://b/"\nalarm_intervals = 0.5', "checkpoints.alarm_intervals", "must be >= 1"),
        ('root = "s3://b/"\nsave_on_failure_s = -1', "checkpoints.save_on_failure_s", "must be >= 0"),
        ('root = "s3://b/"\ntrust = "anyone"', "checkpoints.trust", 'must be one of "any", "owner" or "strict"'),
        ('endpoint_url = "http://x"', "checkpoints.root", "is missing"),
    ],
)
def test_checkpoint_mistakes_name_the_key_and_the_fix(tmp_path: Path, body: str, key: str, words: str) -> None:
    message = error_of(spec_in(tmp_path, MINIMAL_RUN + "[checkpoints]\n" + body + "\n"))
    assert key in message and words in message


# --------------------------------------------------------------------------- the watchdog's limits


def test_the_stall_limit_is_twice_the_units_watchdog() -> None:
    from supervisor.config.daemon_file import LOOP_STALL_LIMIT_S

    unit = (Path(__file__).resolve().parents[2] / "systemd" / "slurm-supervisor@.service").read_text()
    watchdog_s = float(next(line for line in unit.splitlines() if line.startswith("WatchdogSec=")).split("=")[1])
    assert 2 * watchdog_s == LOOP_STALL_LIMIT_S
    assert load_daemon_config(None).daemon.stall_limit_s == LOOP_STALL_LIMIT_S


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[daemon]\npoll_interval_s = 61", "daemon.poll_interval_s = 61"),
        ("[slurm]\ncommand_timeout_s = 90", "slurm.command_timeout_s = 90"),
    ],
)
def test_a_wait_longer_than_the_watchdog_allows_is_refused(tmp_path: Path, text: str, key: str) -> None:
    message = error_of(write(tmp_path, text + "\n", "supervisor.toml"), load_daemon_config)
    name = key.split(".")[1].split(" ")[0]
    assert f"{key}: a " in message and "systemd's watchdog" in message and "every 120 s" in message
    assert f"Fix: set {name} to 60 or less." in message


def test_waits_up_to_half_the_stall_limit_are_accepted(tmp_path: Path) -> None:
    config = load_daemon_config(
        write(tmp_path, "[daemon]\npoll_interval_s = 60\n[slurm]\ncommand_timeout_s = 60\n", "supervisor.toml")
    )
    assert config.daemon.poll_interval_s == 60.0 and config.slurm.command_timeout_s == 60.0
