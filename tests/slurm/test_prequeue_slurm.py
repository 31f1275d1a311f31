"""Issue 31, item 2 on a real Slurm: the next job is pre-queued, held, before the current one ends.

One 1-node run, [continuation] prequeue_s = 52 of time_limit_s = 60: 8 s after the first job
starts, the daemon submits its successor with ``--hold --dependency=afterany:JOB``. The first job
waits until squeue shows that successor pending, only then logs step 5, commits checkpoint step 5
and exits with the continue code; the daemon continues the run, rewrites the resume file and
releases the successor, which starts with ``SSV_RESUME_FROM_FILE=1`` (no ``SSV_RESUME_CHECKPOINT``)
and finds step 5 — a save made after its own submission — in the file, the only incarnation
running. With the daemon killed (``--crash-at=after_execute:submit``: right after the pre-queue's
sbatch, before its journal entry is closed) and started again, there is still exactly one
successor. The successor starts within 5 s of its predecessor's end. No time limit is waited on (the job's --time is the partition's: no signal comes).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from supervisor.adapters.sqlite import SqliteStore
from supervisor.testing.slurm.daemon import SupervisorProcess, write_run

pytestmark = pytest.mark.slurm

MEGATRON_STEP_5 = (
    " iteration        5/      10 | consumed samples: 320 | elapsed time per iteration (ms): 100.0 |"
    " learning rate: 1.0E-04 | global batch size: 64 | lm loss: 2.5 | loss scale: 1.0 | grad norm: 1.0 |"
    " number of skipped iterations: 0 | number of nan iterations: 0 |"
)

SCRIPT = f"""\
trap '' USR1
export SLURM_CONF=${{SLURM_CONF:-$TEST_SLURM_CONF}}
echo "job $SLURM_JOB_ID from_file=${{SSV_RESUME_FROM_FILE:-0}} checkpoint=${{SSV_RESUME_CHECKPOINT-unset}} $(date +%s.%N)" >> "$MARKS"
if [ "${{SSV_RESUME_FROM_FILE:-0}}" = 1 ]; then
    cp "$SSV_RESUME_FILE" "$MARKS.resume.json"
    squeue -h -n prechain -t RUNNING -o %i > "$MARKS.running"
    exit 0
fi
for _ in $(seq 150); do  # until the held successor is in the queue (at most 30 s)
    squeue -h -n prechain -o '%i %T %r' > "$MARKS.queue"
    [ "$(wc -l < "$MARKS.queue")" -ge 2 ] && break
    sleep 0.2
done
echo '{MEGATRON_STEP_5}'
mkdir -p "$CKPT/step_000005" && echo weights > "$CKPT/step_000005/model.bin"
"{sys.executable}" -m supervisor ckpt commit "$CKPT" step_000005 --step 5 >> "$MARKS" 2>&1
sleep 2  # the daemon reads the log line before the job ends
echo "end $(date +%s.%N)" >> "$MARKS"
exit "$SSV_CONTINUE_EXIT_CODE"
"""


def prequeued_run(cluster, tmp_path: Path, prequeue_s: int) -> tuple[Path, Path]:
    marks, ckpt = tmp_path / "marks.txt", tmp_path / "ckpt"
    marks.touch()
    ckpt.mkdir()
    env = {"MARKS": str(marks), "CKPT": str(ckpt), "TEST_SLURM_CONF": str(cluster.slurm_conf)}
    spec = write_run(tmp_path, "prechain", nodes=1, partition=cluster.partition, script_body=SCRIPT, env=env)
    spec.write_text(
        spec.read_text()
        + f'\n[checkpoints]\nroot = "{ckpt}"\nfull_verify = false\nresume_file = "{tmp_path / "resume.json"}"\n'
        + f"[continuation]\nprequeue_s = {prequeue_s}\ntime_limit_s = 60\n"
    )
    return spec, marks


@pytest.mark.parametrize("crash_at", [None, "after_execute:submit"])
def test_the_successor_is_queued_held_before_the_end_and_released_from_the_later_save(
    slurm_cluster, tmp_path, crash_at
):
    # the pre-queue is due 3 s after the start; 8 s with a daemon to stop and start first
    spec, marks = prequeued_run(slurm_cluster, tmp_path, prequeue_s=52 if crash_at else 57)
    sup = SupervisorProcess(slurm_cluster, tmp_path)
    sup.start()
    try:
        sup.cli("submit", str(spec))
        sup.wait_running("prechain", attempt=0)
        if crash_at:  # the next submit is the pre-queue
            assert sup.stop() == 0
            sup.start(f"--crash-at={crash_at}")
            assert sup.wait_exit(timeout=30) == 137
            sup.start()
        ended = sup.wait_ended("prechain", timeout=60)
    finally:
        sup.stop()
    assert ended["state"] == "completed" and ended["restarts"]["spent"] == 0, ended

    lines = marks.read_text().splitlines()
    first, successor = lines[0], lines[-1]
    gap_s = float(successor.split()[-1]) - float(next(x for x in lines if x.startswith("end ")).split()[1])
    assert 0 < gap_s <= 5.0, gap_s  # released once the end is judged: running within seconds
    assert "from_file=0" in first and "from_file=1 checkpoint=unset" in successor, marks.read_text()
    queued = dict(line.split(maxsplit=1) for line in Path(f"{marks}.queue").read_text().splitlines())
    first_id, successor_id = first.split()[1], successor.split()[1]
    assert set(queued) == {first_id, successor_id}  # exactly one successor, queued before the end
    assert queued[first_id].startswith("RUNNING") and queued[successor_id].startswith("PENDING"), queued
    assert "Held" in queued[successor_id] or "Dependency" in queued[successor_id], queued
    plan = json.loads(Path(f"{marks}.resume.json").read_text())
    assert plan["checkpoint"]["step"] == 5  # the save after its submission: the file as of its start
    assert Path(f"{marks}.running").read_text().split() == [successor_id]  # never two at once

    tag = f"slurm-supervisor:prechain:{SqliteStore(sup.state_dir).instance_id}:"
    tagged = {job for job, comment in shown_jobs(slurm_cluster) if comment.startswith(tag)}
    assert tagged == {first_id, successor_id}, tagged
    kinds = [e["kind"] for e in sup.logbook("prechain")]
    assert kinds.count("prequeued") == 1 and "fault" not in kinds and "continued" in kinds, kinds


def shown_jobs(cluster) -> list[tuple[str, str]]:
    """(id, comment) of every job Slurm still shows (finished ones for MinJobAge)."""
    out = cluster.run(["squeue", "-h", "-a", "-t", "all", "-o", "%i|%k"], check=True).stdout
    return [(job, comment) for job, _, comment in (line.partition("|") for line in out.splitlines())]
