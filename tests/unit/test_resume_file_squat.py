"""Issue 32, finding 8: a resume file another account squatted in a shared sticky folder is not
read. Before: mallory created ``resume.json`` first; the daemon could not rename over it (sticky
bit), and the job read mallory's file, naming her ``step_99999999``, as its orders (the only
channel of a pre-queued job, the fallbacks' source in every mode).

Now the daemon signs the file with the run's key (the manifests' HMAC, ``SSV_MANIFEST_KEY`` in the
job's environment) and the job reads only a file its own account owns and, when it holds the key,
one the run signed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from memory_checkpoints import ROOT
from unit.sim_world import SimWorld

from supervisor.domain.checkpoints.signing import KEY_ENV, signed_json
from supervisor.domain.run import CheckpointPolicy
from supervisor.telemetry.orders import ResumeFileError, ResumeOrders
from supervisor.testing.kit.specs import spec

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another UID needs root")
MALLORY_UID = 2002
RESUME = "/shared/llm/resume.json"
PLANTED = {"run": "llm", "checkpoint": {"location": "/scratch/mallory/ckpt/step_99999999", "step": 99999999}}
KEY = bytes(range(32))


def squatted(folder: Path, text: str, uid: int = MALLORY_UID) -> Path:
    folder.mkdir(mode=0o1777, exist_ok=True)
    os.chmod(folder, 0o1777)
    path = folder / "resume.json"
    path.write_text(text)
    os.chown(path, uid, -1)
    return path


@needs_root
def test_a_resume_file_another_account_owns_is_refused_as_the_orders_and_as_fallbacks(tmp_path):
    path = squatted(tmp_path / "shared", json.dumps(PLANTED))
    with pytest.raises(ResumeFileError, match="owned by uid 2002"):
        ResumeOrders.from_env({"SSV_RESUME_FROM_FILE": "1", "SSV_RESUME_FILE": str(path)})
    env = {"SSV_RESUME_CHECKPOINT": "/ckpt/llm/step_000100", "SSV_RESUME_FILE": str(path)}
    assert ResumeOrders.from_env(env).candidates == ("/ckpt/llm/step_000100",)


@needs_root
def test_even_a_copy_of_the_runs_signed_file_is_refused_when_another_account_owns_it(tmp_path):
    path = squatted(tmp_path / "shared", signed_json(PLANTED, KEY))
    with pytest.raises(ResumeFileError, match="owned by uid 2002"):
        ResumeOrders.from_env({"SSV_RESUME_FROM_FILE": "1", "SSV_RESUME_FILE": str(path), KEY_ENV: KEY.hex()})


@pytest.mark.parametrize(
    "text, says",
    [
        (json.dumps(PLANTED), "not signed by the run"),
        (signed_json(PLANTED, bytes(32)), "signature is not the run's"),
        (signed_json(PLANTED, KEY).replace("99999999", "99999998"), "signature is not the run's"),
    ],
)
def test_with_the_runs_key_only_a_file_the_run_signed_is_read(tmp_path, text, says):
    path = tmp_path / "resume.json"
    path.write_text(text)
    with pytest.raises(ResumeFileError, match=says):
        ResumeOrders.from_env({"SSV_RESUME_FROM_FILE": "1", "SSV_RESUME_FILE": str(path), KEY_ENV: KEY.hex()})
    env = {"SSV_RESUME_CHECKPOINT": "/ckpt/llm/step_000100", "SSV_RESUME_FILE": str(path), KEY_ENV: KEY.hex()}
    assert ResumeOrders.from_env(env).candidates == ("/ckpt/llm/step_000100",)


def test_the_file_the_daemon_writes_is_signed_with_the_key_it_hands_the_job(tmp_path):
    policy = CheckpointPolicy(root=ROOT, scan_interval_s=10.0, resume_file=RESUME)
    w = SimWorld(tmp_path, spec(checkpoints=policy, max_restarts=3), watch_checkpoints=True)
    w.ckpt.save(100)
    w.until(w.running)
    env = w.submitted_env(0)
    path = tmp_path / "resume.json"
    path.write_text(w.files[RESUME])
    orders = ResumeOrders.from_env({**env, "SSV_RESUME_FILE": str(path), "SSV_RESUME_FROM_FILE": "1"})
    assert orders.step == 100 and orders.candidates == (ROOT + "step_000100/",)
