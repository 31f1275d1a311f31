"""A pre-queued Megatron job (SSV_RESUME_FROM_FILE=1, no SSV_RESUME_CHECKPOINT): the wrapper loads
the checkpoint the resume file names as of the job's start, starts from scratch when it names none
(never from the tracker's newest, possibly torn, iteration), and refuses a hostile file (93)."""

from __future__ import annotations

import json

from supervisor.telemetry.megatron import EXIT_BAD_INPUT, main

COMMAND = ["--", "torchrun", "pretrain_gpt.py", "--load", "/ckpt/run", "--save", "/ckpt/run"]


def dry_run(capsys, tmp_path, plan: object) -> tuple[int, str]:
    path = tmp_path / "resume.json"
    path.write_text(plan if isinstance(plan, str) else json.dumps(plan))
    env = {"SSV_RESUME_FROM_FILE": "1", "SSV_RESUME_FILE": str(path)}
    code = main(["--dry-run", *COMMAND], env)
    return code, capsys.readouterr().out


def test_the_resume_files_iteration_is_loaded(capsys, tmp_path):
    plan = {"checkpoint": {"location": "/ckpt/run/iter_0000300", "step": 300, "guarantee": "manifest"}}
    code, out = dry_run(capsys, tmp_path, plan)
    assert code == 0 and out.split() == [
        *COMMAND[1:3],
        "--save",
        "/ckpt/run",
        "--load",
        "/ckpt/run",
        "--ckpt-step",
        "300",
    ]


def test_no_checkpoint_in_the_file_starts_from_scratch(capsys, tmp_path):
    code, out = dry_run(capsys, tmp_path, {"checkpoint": None})
    assert code == 0 and "--load" not in out.split()


def test_a_torn_file_is_refused(capsys, tmp_path):
    code, _ = dry_run(capsys, tmp_path, '{"checkpoint": {"location": "/ckpt/run/iter_00')
    assert code == EXIT_BAD_INPUT
