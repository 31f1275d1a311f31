"""Issue 31 on a real Slurm: a job that ends on purpose after a verified save is continued.

One 1-node run. Its first job logs step 5, commits checkpoint step 5 (``slurm-supervisor ckpt
commit`` on a directory) and exits with the continue code 75; the daemon verifies the checkpoint,
continues the run with a second job — no restart spent, no fault — handed ``SSV_RESUME_STEP=5``,
which then completes. A few seconds: nothing waits on a time limit (the TIMEOUT path is the same
decision, covered on the simulator in tests/unit/test_continuation.py)."""

from __future__ import annotations

import sys

import pytest

from supervisor.testing.slurm.daemon import SupervisorProcess, write_run

pytestmark = pytest.mark.slurm

MEGATRON_STEP_5 = (
    " iteration        5/      10 | consumed samples: 320 | elapsed time per iteration (ms): 100.0 |"
    " learning rate: 1.0E-04 | global batch size: 64 | lm loss: 2.5 | loss scale: 1.0 | grad norm: 1.0 |"
    " number of skipped iterations: 0 | number of nan iterations: 0 |"
)

SCRIPT = f"""\
echo "resume step: ${{SSV_RESUME_STEP:-none}} continue code: $SSV_CONTINUE_EXIT_CODE" >> "$MARKS"
if [ -n "$SSV_RESUME_STEP" ]; then exit 0; fi
echo '{MEGATRON_STEP_5}'
mkdir -p "$CKPT/step_000005" && echo weights > "$CKPT/step_000005/model.bin"
"{sys.executable}" -m supervisor ckpt commit "$CKPT" step_000005 --step 5 >> "$MARKS" 2>&1
sleep 2  # the daemon reads the log line before the job ends
exit "$SSV_CONTINUE_EXIT_CODE"
"""


def test_the_continue_code_after_a_verified_save_continues_the_run(slurm_cluster, tmp_path):
    marks, ckpt = tmp_path / "marks.txt", tmp_path / "ckpt"
    marks.touch()
    ckpt.mkdir()
    spec = write_run(
        tmp_path,
        "chain",
        nodes=1,
        partition=slurm_cluster.partition,
        script_body=SCRIPT,
        env={"MARKS": str(marks), "CKPT": str(ckpt)},
    )
    spec.write_text(spec.read_text() + f'\n[checkpoints]\nroot = "{ckpt}"\nfull_verify = false\n')
    sup = SupervisorProcess(slurm_cluster, tmp_path)
    sup.start()
    try:
        sup.cli("submit", str(spec))
        ended = sup.wait_ended("chain", timeout=60)
    finally:
        sup.stop()
    assert ended["state"] == "completed" and ended["restarts"]["spent"] == 0, ended
    kinds = [e["kind"] for e in sup.logbook("chain")]
    assert "continued" in kinds and "fault" not in kinds and "restarted" not in kinds, kinds
    lines = marks.read_text().splitlines()
    assert "resume step: none continue code: 75" in lines and "resume step: 5 continue code: 75" in lines, lines


MEGATRON_16_ONCE = """\
echo "ran on $SLURMD_NODENAME" >> "$MARKS"
if [ ! -e "$MARKS.once" ]; then touch "$MARKS.once"; exit 16; fi
exit 0
"""


def test_megatron_exit_16_is_restarted_once_on_other_nodes(slurm_cluster, tmp_path):
    """Megatron's EXIT_CODE_RESUME_TO_DISAMBIGUATE: run again on other hardware. One restart
    spent, the first job's node kept out of the run (not drained)."""
    marks = tmp_path / "marks.txt"
    marks.touch()
    spec = write_run(
        tmp_path,
        "validate",
        nodes=1,
        partition=slurm_cluster.partition,
        script_body=MEGATRON_16_ONCE,
        env={"MARKS": str(marks)},
    )
    sup = SupervisorProcess(slurm_cluster, tmp_path)
    sup.start()
    try:
        sup.cli("submit", str(spec))
        ended = sup.wait_ended("validate", timeout=60)
    finally:
        sup.stop()
    assert ended["state"] == "completed" and ended["restarts"]["spent"] == 1, ended
    first, second = (line.split()[-1] for line in marks.read_text().splitlines())
    assert first != second
    kinds = [e["kind"] for e in sup.logbook("validate")]
    assert kinds.count("fault") == 1 and "node_drained" not in kinds, kinds
