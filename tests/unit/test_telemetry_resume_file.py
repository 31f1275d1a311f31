"""The trainer reads a pre-queued job's checkpoint from the resume file (SSV_RESUME_FROM_FILE=1):
the file the supervisor writes (domain/checkpoints/resume.py's shape) becomes the orders whole; a
torn, oversized or hostile file is refused with the file's name and what is wrong, never half-used.
No torch: supervisor.telemetry.orders stands alone."""

from __future__ import annotations

import json

import pytest

from supervisor.domain.checkpoints.manifest import Guarantee
from supervisor.domain.checkpoints.resume import CheckpointPick, ResumePlan
from supervisor.telemetry.orders import MAX_RESUME_FILE_BYTES, ResumeFileError, ResumeOrders


def written(tmp_path, plan: ResumePlan | dict | str | bytes) -> dict[str, str]:
    """The environment of a pre-queued job whose resume file holds ``plan``."""
    path = tmp_path / "resume.json"
    if isinstance(plan, ResumePlan):  # as engine/watch/checkpoints.py writes it
        plan = json.dumps({"run": "run42", **plan.to_json()}, indent=1)
    elif isinstance(plan, dict):
        plan = json.dumps(plan)
    path.write_bytes(plan if isinstance(plan, bytes) else plan.encode())
    return {"SSV_RESUME_FROM_FILE": "1", "SSV_RESUME_FILE": str(path)}


def pick(step: int) -> CheckpointPick:
    return CheckpointPick(f"s3://ckpt/run42/step_{step:06d}/", step, Guarantee.MANIFEST)


def test_the_checkpoint_its_step_fallbacks_skip_and_lr_come_from_the_file(tmp_path):
    plan = ResumePlan(chosen=pick(200), fallbacks=(pick(100),), skip_iterations="61-131", lr_scale=0.5)
    orders = ResumeOrders.from_env(written(tmp_path, plan))
    assert orders.candidates == ("s3://ckpt/run42/step_000200/", "s3://ckpt/run42/step_000100/")
    assert orders.step == 200 and 61 in orders.skip and 132 not in orders.skip and orders.lr_scale == 0.5


def test_a_file_that_names_no_checkpoint_starts_from_scratch(tmp_path):
    assert ResumeOrders.from_env(written(tmp_path, ResumePlan(chosen=None))) == ResumeOrders()


def test_the_file_wins_over_a_stale_environment(tmp_path):
    env = written(tmp_path, ResumePlan(chosen=pick(300)))
    env |= {"SSV_RESUME_CHECKPOINT": "/old/step_000100", "SSV_RESUME_STEP": "100"}
    orders = ResumeOrders.from_env(env)
    assert orders.candidates == ("s3://ckpt/run42/step_000300/",) and orders.step == 300


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ('{"checkpoint": {"location": "/ckpt/step_0002', "not whole JSON"),  # torn mid-write
        ("", "not whole JSON"),
        (b"\xff\xfe{}", "not whole JSON"),
        ("[1, 2]", "not an object"),
        ({"fallbacks": []}, "no 'checkpoint'"),
        ({"checkpoint": "/ckpt/step_000200"}, "checkpoint"),
        ({"checkpoint": {"step": 200}}, "location"),
        ({"checkpoint": {"location": "", "step": 200}}, "location"),
        ({"checkpoint": {"location": "--load=/etc", "step": 200}}, "location"),
        ({"checkpoint": {"location": "/ckpt/a\nb", "step": 200}}, "location"),
        ({"checkpoint": {"location": "/c/" + "x" * 5000, "step": 200}}, "location"),
        ({"checkpoint": {"location": "/ckpt/step_000200", "step": -1}}, "step"),
        ({"checkpoint": {"location": "/ckpt/step_000200", "step": True}}, "step"),
        ({"checkpoint": {"location": "/ckpt/step_000200", "step": "200"}}, "step"),
        ({"checkpoint": {"location": "/ckpt/s", "step": 2}, "fallbacks": {"a": 1}}, "fallbacks"),
        ({"checkpoint": {"location": "/ckpt/s", "step": 2}, "fallbacks": [{"location": 7}]}, "location"),
        ({"checkpoint": {"location": "/ckpt/s", "step": 2}, "fallbacks": [{"location": "/f"}] * 1000}, "fallbacks"),
        ({"checkpoint": {"location": "/ckpt/s", "step": 2}, "skip_iterations": "9-3"}, "skip range"),
        ({"checkpoint": {"location": "/ckpt/s", "step": 2}, "skip_iterations": 5}, "skip_iterations"),
        ({"checkpoint": {"location": "/ckpt/s", "step": 2}, "lr_scale": 0}, "lr_scale"),
        ({"checkpoint": {"location": "/ckpt/s", "step": 2}, "lr_scale": "NaN"}, "lr_scale"),
        ('{"checkpoint": null, "lr_scale": NaN}', "lr_scale"),
    ],
)
def test_a_torn_or_hostile_file_is_refused_naming_it(tmp_path, content, says):
    env = written(tmp_path, content)
    with pytest.raises(ResumeFileError, match=says) as refused:
        ResumeOrders.from_env(env)
    assert env["SSV_RESUME_FILE"] in str(refused.value)


def test_an_oversized_file_is_refused_without_being_read_whole(tmp_path):
    env = written(tmp_path, '{"checkpoint": null, "reason": "' + "x" * MAX_RESUME_FILE_BYTES + '"}')
    with pytest.raises(ResumeFileError, match="larger than"):
        ResumeOrders.from_env(env)


def test_a_missing_file_or_variable_is_refused(tmp_path):
    with pytest.raises(ResumeFileError, match="cannot be read"):
        ResumeOrders.from_env({"SSV_RESUME_FROM_FILE": "1", "SSV_RESUME_FILE": str(tmp_path / "none.json")})
    with pytest.raises(ResumeFileError, match="SSV_RESUME_FILE"):
        ResumeOrders.from_env({"SSV_RESUME_FROM_FILE": "1"})
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(ResumeFileError, match="cannot be read"):
        ResumeOrders.from_env({"SSV_RESUME_FROM_FILE": "1", "SSV_RESUME_FILE": str(tmp_path / "dir.json")})


def test_from_file_must_be_0_or_1():
    with pytest.raises(ValueError, match="SSV_RESUME_FROM_FILE"):
        ResumeOrders.from_env({"SSV_RESUME_FROM_FILE": "yes"})
    assert ResumeOrders.from_env({"SSV_RESUME_FROM_FILE": "0", "SSV_RESUME_CHECKPOINT": "/c/s"}).candidates == ("/c/s",)
