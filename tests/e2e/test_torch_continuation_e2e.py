"""Issue 31, item 6 on a real Slurm with real PyTorch: the example ends its job on purpose.

examples/torch on two nodes with [continuation] signal = "USR1": once the trainer is past step 10
the test sends SIGUSR1 to the batch shell (``scancel --signal=USR1 --batch``, what Slurm's
``--signal=B:USR1@lead`` does before the limit; the partition has none, so Slurm sends nothing
itself). train.sbatch hands it to the step, both ranks save the step they completed and exit 75;
the supervisor continues the run: 0 restarts, no fault, and the next job trains from the step
after the save (no step lost), its samples continuing. ~40 s here. The same in in-allocation mode
(train_launch.sbatch: torchrun under `slurm-supervisor launch`), ~45 s.
"""

from __future__ import annotations

import pytest

from supervisor.testing.slurm.daemon import SupervisorProcess
from supervisor.testing.slurm.localslurm import LocalSlurm
from supervisor.testing.torch.torch_scenarios import completed, last_step, wait_for
from supervisor.testing.torch.torchrun import TorchRun

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

STEPS = 60  # 0.1 s each: the signal arrives well before the last one


def signal_past_step_10(sup: SupervisorProcess, cluster: LocalSlurm, run: TorchRun) -> None:
    """SIGUSR1 to the batch shell once the trainer is past step 10 (the job's id asked before: a
    CLI call takes seconds on a busy host, longer than the steps left)."""
    sup.cli("submit", str(run.workdir / "gpt.toml"))
    job = sup.wait_running("gpt", attempt=0, interval=0.5)["attempts"][0]["job_id"]
    wait_for("step 10", lambda: last_step(run, 0) >= 10, 90, sup, interval=0.05)
    cluster.run(["scancel", "--signal=USR1", "--batch", str(job)], check=True)


def test_the_continuation_signal_saves_the_step_and_the_next_job_goes_on_from_it(torch_ready, slurm_cluster, tmp_path):
    args = ["--steps", str(STEPS), "--ckpt-every", "1000", "--min-step-s", "0.1"]  # no periodic save: only the signal's
    run = TorchRun(tmp_path, slurm_cluster.partition, str(tmp_path / "ckpt"), train_args=args)
    run.write_corpus()  # as every scenario does: the ranks then read one whole file
    spec = run.spec(checkpoints="full_verify = false\n")
    spec.write_text(spec.read_text() + '[continuation]\nsignal = "USR1"\nlead_s = 60\n')
    sup = SupervisorProcess(slurm_cluster, tmp_path)
    sup.start()
    try:
        signal_past_step_10(sup, slurm_cluster, run)
        wait_for("the run completed", lambda: completed(sup), 120, sup)
    finally:
        sup.stop()
    status = sup.status("gpt")
    assert status["restarts"]["spent"] == 0 and status["attempts"][0]["exit_code"] == 75, status
    kinds = [e["kind"] for e in sup.logbook("gpt")]
    assert "continued" in kinds and "fault" not in kinds and "restarted" not in kinds, kinds
    saved = last_step(run, 0)
    second = run.trained(1)
    assert 10 <= saved < STEPS and second[0]["step"] == saved + 1, (saved, second[:2])  # no step lost
    assert second[-1]["step"] == STEPS and second[0]["consumed_samples"] == (saved + 1) * 16


def test_in_allocation_with_torchrun_the_signal_ends_the_job_as_a_continuation(torch_ready, slurm_cluster, tmp_path):
    """train_launch.sbatch: the batch shell is `slurm-supervisor launch`, which hands the signal to
    the step's srun; torchrun reports only 0 or 1 and the first node to end takes the other down
    (--kill-on-bad-exit): the job must still end with the trainer's 75 and be continued."""
    args = ["--steps", str(STEPS), "--ckpt-every", "1000", "--min-step-s", "0.1"]
    run = TorchRun(
        tmp_path, slurm_cluster.partition, str(tmp_path / "ckpt"), train_args=args, script="train_launch.sbatch"
    )
    run.write_corpus()
    spec = run.spec(checkpoints="full_verify = false\n", restart='mode = "in-allocation"\nhot_spares = 1\n')
    spec.write_text(spec.read_text() + '[continuation]\nsignal = "USR1"\nlead_s = 60\n')
    sup = SupervisorProcess(slurm_cluster, tmp_path)
    sup.start()
    try:
        signal_past_step_10(sup, slurm_cluster, run)
        wait_for("the run completed", lambda: completed(sup), 120, sup)
    finally:
        sup.stop()
    status = sup.status("gpt")
    assert status["restarts"]["spent"] == 0 and status["attempts"][0]["exit_code"] == 75, status
    kinds = [e["kind"] for e in sup.logbook("gpt")]
    assert "continued" in kinds and "fault" not in kinds and "restarted" not in kinds, kinds
    saved = last_step(run, 0)
    second = run.trained(1)
    assert 10 <= saved < STEPS and second[0]["step"] == saved + 1, (saved, second[:2])  # no step lost
