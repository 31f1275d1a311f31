"""A run spec cannot reach past its run: its environment goes to the job only (never to the sbatch
client the daemon runs), and its sbatch_args cannot set what the supervisor owns however they are
spelt (issue 17, item 3; review findings #4 and #14). Each attack here failed on the old code."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from supervisor.adapters.slurm.cli import SlurmCli
from supervisor.config import ConfigError, load_run_file
from supervisor.domain.cluster import SubmitRequest
from supervisor.ports import PermanentError


def write_spec(tmp_path: Path, *run_lines: str) -> Path:
    (tmp_path / "train.sh").write_text("#!/bin/sh\n#SBATCH --time=1:00:00\nsrun python train.py\n")
    spec = tmp_path / "run.toml"
    body = ["[run]", 'name = "r1"', 'script = "train.sh"', 'partition = "gpu"', "nodes = 2", *run_lines]
    spec.write_text("\n".join(body) + "\n")
    return spec


def refused(tmp_path: Path, *run_lines: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_run_file(write_spec(tmp_path, *run_lines))
    return str(caught.value)


# ------------------------------------------------------------------ env: the job's, not the client's


def fake_sbatch(folder: Path, marker: Path) -> None:
    """An sbatch that records its argv, its own environment and the --export-file it was handed."""
    folder.mkdir(exist_ok=True)
    body = f"""#!/bin/sh
printf '%s\\n' "$@" > {marker}.argv
env > {marker}.env
for a in "$@"; do
  case "$a" in --export-file=*) tr '\\000' '\\n' < /dev/fd/"${{a#--export-file=}}" > {marker}.job ;; esac
done
echo 77
"""
    path = folder / "sbatch"
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def request(**env: str) -> SubmitRequest:
    return SubmitRequest(
        run="r1", script="/srv/run.sh", job_name="r1", partition="gpu", nodes=2, comment="tag", env=env
    )


def test_a_path_in_the_job_env_does_not_choose_the_sbatch_the_daemon_runs(tmp_path):
    good, evil = tmp_path / "good", tmp_path / "evil"
    fake_sbatch(good, tmp_path / "good-run")
    fake_sbatch(evil, tmp_path / "evil-run")
    cli = SlurmCli(env={"PATH": f"{good}:/usr/bin:/bin"})  # the daemon's own PATH
    assert cli.submit(request(PATH=f"{evil}:/usr/bin:/bin")) == 77
    assert not Path(f"{tmp_path / 'evil-run'}.argv").exists(), "the spec's PATH chose the daemon's sbatch"
    client_env = Path(f"{tmp_path / 'good-run'}.env").read_text()
    assert str(evil) not in client_env
    assert f"PATH={evil}:/usr/bin:/bin" in Path(f"{tmp_path / 'good-run'}.job").read_text().splitlines()


def test_ld_preload_and_the_token_never_enter_the_sbatch_clients_environment(tmp_path):
    fake_sbatch(tmp_path / "bin", tmp_path / "run")
    cli = SlurmCli(bin_dir=str(tmp_path / "bin"))
    cli.submit(request(LD_PRELOAD="/tmp/evil.so", SLURM_SUPERVISOR_TOKEN="s3cr3t", FOO="a,b c\nd"))
    client = Path(f"{tmp_path / 'run'}.env").read_text()
    assert "LD_PRELOAD" not in client and "s3cr3t" not in client
    job = Path(f"{tmp_path / 'run'}.job").read_text()
    assert "LD_PRELOAD=/tmp/evil.so" in job and "SLURM_SUPERVISOR_TOKEN=s3cr3t" in job
    assert "FOO=a,b c\nd" in job  # commas and newlines reach the job intact


def test_the_clients_resolved_once_at_start_from_the_daemons_own_path(tmp_path):
    fake_sbatch(tmp_path / "bin", tmp_path / "run")
    cli = SlurmCli(env={"PATH": str(tmp_path / "bin")})
    (tmp_path / "bin" / "sbatch").rename(tmp_path / "bin" / "moved")  # a later PATH change is not followed
    fake_sbatch(tmp_path / "later", tmp_path / "later-run")
    cli.env["PATH"] = str(tmp_path / "later")
    with pytest.raises(PermanentError, match="sbatch"):
        cli.submit(request())
    assert not Path(f"{tmp_path / 'later-run'}.argv").exists()


@pytest.mark.parametrize(
    "name",
    [
        "PATH",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "PYTHONPATH",
        "PYTHONHOME",
        "SLURM_CONF",
        "SBATCH_EXPORT",
        "SLURM_JOB_ID",
    ],
)
def test_a_spec_may_not_set_variables_that_steer_programs_or_slurm(tmp_path, name):
    message = refused(tmp_path, f'env = {{ {name} = "/tmp/x", NCCL_DEBUG = "WARN" }}')
    assert f"run.env.{name}" in message or name in message, message


def test_a_nul_in_an_env_value_is_refused(tmp_path):
    assert "NUL" in refused(tmp_path, 'env = { FOO = "a\\u0000b" }')


# ------------------------------------------------------------------ sbatch_args: sbatch's own grammar


@pytest.mark.parametrize(
    ("args", "owned"),
    [
        (["-vxgpu-[001-002]"], "--exclude"),
        (["-vN4"], "--nodes"),
        (["-Hwgpu-001"], "--nodelist"),
        (["-QJother"], "--job-name"),
        (["-x", "gpu-001"], "--exclude"),
        (["--wait"], "--wait"),
        (["-W"], "--wait"),
        (["-vW"], "--wait"),
        (["--array=0-3"], "--array"),
        (["-a1-2"], "--array"),
        (["--export=NONE"], "--export"),
        (["--exp=NONE"], "--export"),
        (["--export-file=/tmp/env"], "--export-file"),
        (["--output=/etc/shadow"], "--output"),
        (["-o/tmp/x.out"], "--output"),
        (["--error", "/tmp/x.err"], "--error"),
        (["-e/tmp/x.err"], "--error"),
        (["--dependency=afterok:1"], "--dependency"),
        (["-dafterok:1"], "--dependency"),
        (["--no-requeue"], "--requeue"),
        (["--comment", "x"], "--comment"),
        (["--time", "10", "--clusters=other"], "--clusters"),
    ],
)
def test_owned_options_are_refused_however_they_are_spelt(tmp_path, args, owned):
    quoted = ", ".join(f'"{a}"' for a in args)
    message = refused(tmp_path, f"sbatch_args = [{quoted}]")
    assert "sbatch_args" in message and owned in message, message


@pytest.mark.parametrize(
    "args",
    [
        ["--time", "10"],
        ["-t", "10", "-c8"],
        ["--constraint", "-xgpu"],  # the value of --constraint, not an -x
        ["--gres=gpu:8", "--exclusive", "-vvv"],
        ["--mem=0", "--hold", "-Q"],
        ["--kill-on-invalid-dep=yes"],
    ],
)
def test_ordinary_options_pass(tmp_path, args):
    quoted = ", ".join(f'"{a}"' for a in args)
    assert load_run_file(write_spec(tmp_path, f"sbatch_args = [{quoted}]")).run.sbatch_args == tuple(args)


@pytest.mark.parametrize("args", [["other.sh"], ["--", "x"], ["-"], ["--time"]])
def test_positional_words_and_missing_values_are_refused(tmp_path, args):
    quoted = ", ".join(f'"{a}"' for a in args)
    assert "sbatch_args" in refused(tmp_path, f"sbatch_args = [{quoted}]")


@pytest.mark.parametrize("line", ["#SBATCH --wait", "#SBATCH -a 0-3", "#SBATCH -vw gpu-1", "#SBATCH --clusters=x"])
def test_the_scripts_own_directives_cannot_set_what_the_command_line_does_not_override(tmp_path, line):
    spec = write_spec(tmp_path)
    (tmp_path / "train.sh").write_text(f"#!/bin/sh\n{line}\nsrun python train.py\n")
    with pytest.raises(ConfigError, match="line 2 of the script"):
        load_run_file(spec)


def test_env_with_commas_reaches_the_job_on_real_slurm(slurm_cluster, tmp_path):
    """--export-file carries values sbatch's --export list cannot (commas, newlines)."""
    out = slurm_cluster.root / f"env-{os.getpid()}-{tmp_path.name}"
    script = slurm_cluster.root / f"env-{tmp_path.name}.sh"
    script.write_text(f"#!/bin/sh\nenv -0 > {out}\n")
    cli = SlurmCli(slurm_conf=str(slurm_cluster.slurm_conf), env=slurm_cluster.env)
    req = SubmitRequest(
        run="r1",
        script=str(script),
        job_name="r1",
        partition=slurm_cluster.partition,
        nodes=1,
        comment="tag",
        env={"FOO": "a,b c", "MULTI": "x\ny"},
        output=str(slurm_cluster.root / "env-%j.out"),
        workdir=str(slurm_cluster.root),
    )
    cli.submit(req)
    slurm_cluster.wait_for(lambda: out.exists() and out.stat().st_size > 0, 30, message="the job's env")
    env = dict(e.split("=", 1) for e in out.read_text().split("\0") if "=" in e)
    assert env["FOO"] == "a,b c" and env["MULTI"] == "x\ny"
    assert env.get("PATH") == slurm_cluster.env["PATH"]  # the rest of the environment, as --export=ALL gave it
