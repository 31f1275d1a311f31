"""A loss spike that does not heal, on real parts: the real daemon, a real Slurm, checkpoints on a
POSIX root committed with the trainer API. The synthetic trainer logs Megatron lines and commits a
checkpoint every 50 steps; from step 330 its loss jumps and stays up. The supervisor must stop the
job and restart it from the newest verified checkpoint at least `min_steps_before` steps before the
onset, with the skip range in its environment — and the logbook must say so."""

from __future__ import annotations

import sys
import time

import pytest

from supervisor.testing.slurm.daemon import SupervisorProcess, spared_run

pytestmark = pytest.mark.slurm

TRAINER = """
import os, sys, time
from supervisor.adapters.checkpoints.commit import build_manifest, commit_checkpoint
from supervisor.adapters.checkpoints.posix import PosixBackend

root, marks = os.environ["CKPT_ROOT"], os.environ["MARKS"]
attempt = os.environ["SLURM_SUPERVISOR_ATTEMPT"]
with open(marks, "a") as f:
    f.write("start attempt=%s step=%s skip=%s lr=%s\\n" % (attempt, os.environ.get("SSV_RESUME_STEP"),
            os.environ.get("SSV_SKIP_ITERATIONS"), os.environ.get("SSV_LR_SCALE")))
if attempt != "0":
    time.sleep(3600)
backend = PosixBackend(root)
for step in range(10, 2001, 10):
    loss = 2.0 - step * 1e-4
    if step >= 330:
        loss *= 1.8  # a spike that never heals
    print(" iteration %8d/ 100000 | consumed samples: %d | elapsed time per iteration (ms): 100.0 | "
          "learning rate: 1.000E-04 | global batch size: 64 | lm loss: %.6E | loss scale: 1.0 | "
          "grad norm: 1.000 | number of skipped iterations: 0 | number of nan iterations: 0 |"
          % (step, step * 64, loss), flush=True)
    if step % 50 == 0:
        name = "step_%06d" % step
        os.makedirs(os.path.join(root, name), exist_ok=True)
        with open(os.path.join(root, name, "model.pt"), "wb") as f:
            f.write(os.urandom(4096))
        commit_checkpoint(backend, name, build_manifest(backend, name, step, writer="rank0"))
    time.sleep(0.1)
time.sleep(3600)
"""


def run_until_attempt(slurm_cluster, tmp_path, trainer_text: str, attempt: int, timeout: float):
    """The real daemon supervising the synthetic trainer on real Slurm, POSIX checkpoints, until
    ``attempt`` has started; returns (the supervisor process, the trainer's marks file)."""
    root = tmp_path / "ckpt"
    root.mkdir()
    marks = tmp_path / "marks.txt"
    trainer = tmp_path / "trainer.py"
    trainer.write_text(trainer_text)
    spec = spared_run(
        slurm_cluster,
        tmp_path,
        script_body=f'exec "{sys.executable}" "{trainer}"\n',
        env={"MARKS": str(marks), "CKPT_ROOT": str(root)},
    )
    with spec.open("a") as f:
        f.write(
            f'[checkpoints]\nroot = "{root}"\nscan_interval_s = 1\nfull_verify = false\n'
            "[spikes]\nheal_window_steps = 40\nmin_steps_before = 50\nskip_batches = 60\n"
        )
    sup = SupervisorProcess(slurm_cluster, tmp_path)
    sup.start()
    try:
        sup.cli("submit", str(spec))
        sup.wait_running("llm", attempt=attempt, timeout=timeout, interval=0.2)
        deadline = time.monotonic() + 30
        while f"start attempt={attempt}" not in (marks.read_text() if marks.exists() else ""):
            assert time.monotonic() < deadline, marks.read_text()
            time.sleep(0.2)
    finally:
        sup.stop()
    return sup, marks


def test_an_unhealed_spike_rolls_back_to_a_verified_checkpoint_before_it(slurm_cluster, tmp_path):
    sup, marks = run_until_attempt(slurm_cluster, tmp_path, TRAINER, attempt=1, timeout=120)
    second = next(line for line in marks.read_text().splitlines() if line.startswith("start attempt=1"))
    book = sup.logbook("llm")
    rollback = next(e for e in book if e["kind"] == "rollback")
    ev = rollback["evidence"]
    assert ev["onset_step"] == 330 and ev["checkpoint_step"] == 250, ev  # newest verified <= 330 - 50
    assert (ev["skip_first"], ev["skip_last"]) == (251, 380) and ev["series"]
    assert second == "start attempt=1 step=250 skip=251-380 lr=None", second
    restarted = [e for e in book if e["kind"] == "restarted"][0]
    assert "rollback to step 250" in restarted["message"] and "skipping iterations 251-380" in restarted["message"]
    assert [e for e in book if e["kind"] == "spike"]


TRAINER_TWICE = (
    TRAINER.replace(
        'if attempt != "0":\n    time.sleep(3600)',
        'if attempt not in ("0", "1"):\n    time.sleep(3600)\nfirst = int(os.environ.get("SSV_RESUME_STEP") or 0) + 10\n'
        'spike_at = 330 if attempt == "0" else 600',
    )
    .replace("for step in range(10, 2001, 10):", "for step in range(first, 2001, 10):")
    .replace("if step >= 330:", "if step >= spike_at:")
    .replace(
        "    if step % 50 == 0:",
        "    if step % 50 == 0 and not os.path.exists(os.path.join(root, 'step_%06d' % step)):",
    )
)


def test_a_second_spike_near_the_first_rolls_back_with_a_lower_learning_rate(slurm_cluster, tmp_path):
    """Issue 21 item 10, on real Slurm: the attempt resumed after the first rollback spikes again
    within [spikes] near_steps of the first onset; the second rollback escalates and the next
    attempt is handed SSV_LR_SCALE (0.5 by default) with both skip ranges."""
    sup, marks = run_until_attempt(slurm_cluster, tmp_path, TRAINER_TWICE, attempt=2, timeout=240)
    starts = [line for line in marks.read_text().splitlines() if line.startswith("start")]
    book = sup.logbook("llm")
    rollbacks = [e["evidence"] for e in book if e["kind"] == "rollback"]
    assert [r["onset_step"] for r in rollbacks] == [330, 600], rollbacks
    assert rollbacks[1]["escalation"] == 1 and rollbacks[1]["lr_scale"] == 0.5, rollbacks[1]
    assert starts[1] == "start attempt=1 step=250 skip=251-380 lr=None", starts
    third = starts[2]
    assert third.startswith("start attempt=2 step=550 skip=251-380,551-") and third.endswith("lr=0.5"), starts
    restarted = [e for e in book if e["kind"] == "restarted"][-1]
    assert "LR ×0.5" in restarted["message"], restarted["message"]
