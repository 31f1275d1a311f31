"""Issue 31, items 2 and 3 on a real Slurm: a run preempted by a higher-priority job and requeued
by Slurm (PreemptMode=REQUEUE) is continued, no restart spent.

One cluster of one node with preemption configured (PreemptType=preempt/partition_prio): the
partition ``main`` has PreemptMode=REQUEUE and GraceTime=5, ``urgent`` a higher PriorityTier. The
run is in restart mode "requeue" (a requeueable job; Slurm keeps its id). Its trainer, the batch
shell, logs step 5. Once the urgent job is submitted Slurm sets the job's PreemptTime (the daemon
sees it) and gives it its GraceTime (on 22.05 its SIGTERM goes to steps, and this job has none);
then it kills the job for the requeue: SIGTERM to the batch shell, on which the trainer commits
checkpoint step 5 and exits 75. Slurm requeues the run's job, runs the urgent one, and the run's
job comes back (restart 1) and completes. The supervisor spends no restart, books no fault and no
interruption, and goodput books the gap under 'preempted'. ~40 s: Slurm 22.05 kills a preempted
job at its next periodic check after the grace, up to 30 s later.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from supervisor.testing.slurm.daemon import SupervisorProcess, write_run
from supervisor.testing.torch.torch_scenarios import wait_for

pytestmark = pytest.mark.slurm


def _slurm_release() -> str:
    """The installed slurmctld's version ("24.11.5"), "" when there is none."""
    try:
        out = subprocess.run(["slurmctld", "-V"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.split()[-1] if out.split() else ""


# Known gap (issue 31, open): on 24.11 the preempted run's logbook is not yet the continuation it is
# on 22.05 and 26.05: Slurm requeues the job twice (restart 0 -> 1 -> 2) and a restart is spent;
# xfail, not strict, until the whole sequence is read as the one preemption.
ON_24_11 = _slurm_release().startswith("24.11")

MEGATRON_STEP_5 = (
    " iteration        5/      10 | consumed samples: 320 | elapsed time per iteration (ms): 100.0 |"
    " learning rate: 1.0E-04 | global batch size: 64 | lm loss: 2.5 | loss scale: 1.0 | grad norm: 1.0 |"
    " number of skipped iterations: 0 | number of nan iterations: 0 |"
)

TRAINER = f"""\
if [ "${{SLURM_RESTART_COUNT:-0}}" != 0 ]; then echo "came back" >> "$MARKS"; exit 0; fi
save() {{
    mkdir -p "$CKPT/step_000005" && echo weights > "$CKPT/step_000005/model.bin"
    "{sys.executable}" -m supervisor ckpt commit "$CKPT" step_000005 --step 5 >> "$MARKS" 2>&1
    echo "saved on SIGTERM" >> "$MARKS"
    exit "$SSV_CONTINUE_EXIT_CODE"
}}
trap save TERM
echo '{MEGATRON_STEP_5}'
echo "training" >> "$MARKS"
while :; do sleep 0.1; done
"""

PREEMPTION = {"PreemptType": "preempt/partition_prio", "PreemptMode": "REQUEUE"}


@pytest.mark.xfail(ON_24_11, reason="issue 31: preemption on 24.11 is not yet read as a continuation", strict=False)
def test_a_run_preempted_after_its_grace_save_is_continued_without_a_restart(make_slurm, tmp_path):
    cluster = make_slurm(
        1,
        extra_conf=PREEMPTION,
        partition_options="PreemptMode=REQUEUE GraceTime=5",
        extra_partitions={"urgent": "PriorityTier=2 PreemptMode=OFF"},
    )
    marks, ckpt = tmp_path / "marks.txt", tmp_path / "ckpt"
    marks.touch()
    ckpt.mkdir()
    spec = write_run(
        tmp_path,
        "chain",
        nodes=1,
        partition=cluster.partition,
        script_body=TRAINER,
        env={"MARKS": str(marks), "CKPT": str(ckpt)},
    )
    spec.write_text(
        spec.read_text()
        + f'mode = "requeue"\n[checkpoints]\nroot = "{ckpt}"\nfull_verify = false\nscan_interval_s = 1\n'
    )
    sup = SupervisorProcess(cluster, tmp_path)
    sup.start()
    try:
        sup.cli("submit", str(spec))
        sup.wait_running("chain", attempt=0, interval=0.2)
        wait_for("the trainer's step 5", lambda: "training" in marks.read_text(), 30, sup, 0.1)
        urgent = ["sbatch", "--parsable", "-p", "urgent", "-N1", "-o", "/dev/null", "--wrap", "sleep 1"]
        cluster.run(urgent, check=True)
        ended = sup.wait_ended("chain", timeout=120)
    finally:
        sup.stop()
    lines = marks.read_text().splitlines()
    assert "saved on SIGTERM" in lines and "came back" in lines, lines
    entries = sup.logbook("chain")
    kinds = [e["kind"] for e in entries]
    said = "\n".join(f"{e['kind']}: {e.get('message', '')}" for e in entries)  # whole, not truncated
    assert ended["state"] == "completed" and ended["restarts"]["spent"] == 0, said
    assert "continued" in kinds and "fault" not in kinds and "requeued" not in kinds, said
    assert kinds.count("note") == 1, kinds  # the preemption seen once, on the attempt it ended
    booked = json.loads(sup.cli("logbook", "goodput", "chain", "--json").stdout)
    assert booked["interruptions"] == 0 and "preempted" in booked["lost_by_cause_s"], booked
