"""Real training under the real daemon on a real Slurm: examples/torch/train.py (a tiny GPT, two
nodes, torchrun + gloo, DCP checkpoints committed with the supervisor's manifest).

* A node crashes mid-training: the run resumes on healthy nodes from the newest verified
  checkpoint, its loss there where it was, its sample counter continuing from the checkpoint.
* Poisoned batches (planted in the corpus) make a loss spike that does not heal: the supervisor
  rolls back to a verified checkpoint before it and the restarted trainer never trains on them.
* One node of three is slowed (its CPU capped through a cgroup v1 cpu quota): it is named a
  straggler from the ranks' compute times, and the run moves past it at a checkpoint boundary.

Steps are paced at 0.1 s (``--min-step-s``) so that the supervisor's 0.5 s polls see the run
step by step; each test takes ~50-85 s here (2 shared cores, other test runs beside).
"""

from __future__ import annotations

import contextlib
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.testing.daemon import SupervisorProcess
from supervisor.testing.torchrun import TorchRun

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

GLOBAL_BATCH = 16  # 2 ranks x --batch 8
STEPS = 80
CRASH_AT = 50  # 10 steps past checkpoint 40


def wait_for(what: str, check: Callable[[], Any], timeout: float, sup: SupervisorProcess, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sup.proc is not None and sup.proc.poll() is not None:
            raise AssertionError(f"daemon exited while waiting for {what}:\n{sup.log_path.read_text()[-3000:]}")
        got = check()
        if got:
            return got
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout} s; logbook:\n{timeline(sup)}")


def timeline(sup: SupervisorProcess) -> str:
    return "\n".join(f"{e['kind']:>20} {e['message'][:160]}" for e in sup.logbook("gpt"))


def last_step(run: TorchRun, attempt: int) -> int:
    return max((e["step"] for e in run.trained(attempt)), default=0)


def completed(sup: SupervisorProcess) -> bool:
    return sup.status("gpt")["state"] == "completed"


def losses(entries: list[dict[str, Any]]) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in entries}


def test_node_crash_mid_training_resumes_from_the_newest_verified_checkpoint(
    torch_ready, slurm_cluster, moto_s3, tmp_path
):
    bucket = f"gpt-{uuid.uuid4().hex[:8]}"
    moto_s3.create_bucket(bucket)
    storage = {**moto_s3.credentials_env(), "AWS_ENDPOINT_URL": moto_s3.endpoint_url}
    run = TorchRun(
        tmp_path,
        slurm_cluster.partition,
        f"s3://{bucket}/gpt/",
        spares=slurm_cluster.nodes[-1],
        train_args=["--steps", str(STEPS), "--ckpt-every", "20", "--min-step-s", "0.1"],
        storage_env=storage,
        endpoint_url=moto_s3.endpoint_url,
    )
    run.write_corpus()
    spec = run.spec(checkpoints="full_verify = false\n")
    sup = SupervisorProcess(slurm_cluster, tmp_path)
    sup.start(env=moto_s3.credentials_env())
    try:
        sup.cli("submit", str(spec))
        began = time.monotonic()
        first = sup.wait_running("gpt", attempt=0, interval=0.5)
        wait_for("step 50 trained", lambda: last_step(run, 0) >= CRASH_AT, 120, sup, interval=0.05)
        training_at = time.monotonic()
        victim = first["running_on"][0]  # the batch host, where rank 0 runs
        slurm_cluster.crash_node(victim)
        crashed = time.monotonic()
        sup.wait_running("gpt", attempt=1, avoid=[victim], timeout=60, interval=0.5)
        wait_for("the run completed", lambda: completed(sup), 90, sup, interval=1.0)
        print(f"step {CRASH_AT} at {training_at - began:.1f} s, crash at {crashed - began:.1f} s, "
              f"completed at {time.monotonic() - began:.1f} s")  # fmt: skip
    finally:
        sup.stop()
    book = sup.logbook("gpt")
    restarted = next(e for e in book if e["kind"] == "restarted")
    resumed = restarted["evidence"]["resume_step"]
    assert restarted["evidence"]["resume"]["checkpoint"]["guarantee"] == "manifest", restarted
    last_before = run.trained(0)[-1]["step"]
    newest_committed = last_before // 20 * 20  # a save at the crash may not have been committed
    assert resumed in (newest_committed, newest_committed - 20) and resumed >= 40, (resumed, last_before)
    assert [e["evidence"]["node"] for e in book if e["kind"] == "node_drained"] == [victim], timeline(sup)

    before, after = run.trained(0), run.trained(1)
    steps_after = [e["step"] for e in after]
    assert steps_after == list(range(resumed + 1, STEPS + 1)), steps_after  # no batch repeated, none lost
    assert [e["consumed_samples"] for e in after] == [s * GLOBAL_BATCH for s in steps_after]
    # the work lost is what the logbook says: the steps past the checkpoint that attempt 0 reached
    assert abs(restarted["evidence"]["last_step"] - last_before) <= 1, (restarted["evidence"], last_before)
    assert resumed < last_before

    loss0, loss1 = losses(before), losses(after)
    window = [loss0[s] for s in range(resumed - 9, resumed + 1)]
    noise = statistics.stdev(window)
    assert abs(loss1[resumed + 1] - loss0[resumed]) <= 3 * noise, (loss1[resumed + 1], loss0[resumed], noise)
    # the same weights, optimizer state and batch: the first step after the resume replays attempt 0's
    assert loss1[resumed + 1] == pytest.approx(loss0[resumed + 1], rel=1e-4)


POISON = (81, 120)  # after the steep start, so the baseline's noise is the run's own


def test_an_unhealed_spike_from_poisoned_batches_is_rolled_back_and_the_batches_skipped(
    torch_ready, slurm_cluster, tmp_path
):
    root = tmp_path / "ckpt"
    root.mkdir()
    run = TorchRun(
        tmp_path,
        slurm_cluster.partition,
        str(root),
        spares=slurm_cluster.nodes[-1],
        train_args=["--steps", "160", "--ckpt-every", "20", "--min-step-s", "0.1"],
    )
    run.write_corpus(poison=POISON, global_batch=GLOBAL_BATCH)
    spec = run.spec(
        checkpoints="full_verify = false\n",
        spikes="heal_window_steps = 20\nmin_steps_before = 15\nskip_batches = 70\n",
    )
    sup = SupervisorProcess(slurm_cluster, tmp_path)
    sup.start()
    try:
        sup.cli("submit", str(spec))
        sup.wait_running("gpt", attempt=0, interval=0.5)
        sup.wait_running("gpt", attempt=1, timeout=120, interval=0.5)
        wait_for("the run completed", lambda: completed(sup), 90, sup, interval=1.0)
    finally:
        sup.stop()
    book = sup.logbook("gpt")
    rollback = next(e for e in book if e["kind"] == "rollback")["evidence"]
    assert rollback["onset_step"] in (POISON[0], POISON[0] + 1) and rollback["checkpoint_step"] == 60, rollback
    first_skipped, last_skipped = rollback["skip_first"], rollback["skip_last"]
    assert first_skipped == 61 and last_skipped >= POISON[1], rollback
    restarted = next(e for e in book if e["kind"] == "restarted")
    assert f"skipping iterations {first_skipped}-{last_skipped}" in restarted["message"], restarted["message"]
    assert any(e["kind"] == "spike" for e in book), timeline(sup)
    assert not any(e["kind"] == "backoff" for e in book), timeline(sup)  # a rollback is no fast failure

    after = run.trained(1)
    trained = [e["batch"] for e in after]
    assert trained == list(range(last_skipped + 1, 161)), trained
    assert not set(trained) & set(range(POISON[0], POISON[1] + 1))
    skipped = [e["step"] for e in run.trace() if e.get("attempt") == "1" and e.get("skipped")]
    assert skipped == list(range(61, last_skipped + 1))
    assert [e["consumed_samples"] for e in after] == [s * GLOBAL_BATCH for s in trained]

    loss0, loss1 = losses(run.trained(0)), losses(after)
    healthy = loss0[60]
    poisoned = statistics.median(loss0[s] for s in range(POISON[0], max(loss0) + 1))
    assert poisoned > 1.3 * healthy, (poisoned, healthy)
    assert loss1[last_skipped + 1] < 1.15 * healthy, (loss1[last_skipped + 1], healthy)  # the loss came back
    assert statistics.median(list(loss1.values())[-10:]) <= healthy * 1.05


CPU_V1 = Path("/sys/fs/cgroup/cpu")  # a cgroup v1 cpu hierarchy (LocalSlurm's cgroup2 has no cpu controller)


@contextlib.contextmanager
def throttled(pids: list[int], quota_us: int = 1000, period_us: int = 10_000) -> Iterator[None]:
    """Cap ``pids`` (and the threads and children they start) at quota_us of CPU per period_us
    (10 %, in short periods so that every step is slowed alike: a 2 ms computation takes ~20 ms):
    a slow node, as a GPU with falling clocks is."""
    group = CPU_V1 / f"ssv-slow-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text(str(period_us))
        (group / "cpu.cfs_quota_us").write_text(str(quota_us))
        for pid in pids:
            try:
                (group / "cgroup.procs").write_text(str(pid))
            except ProcessLookupError:
                pass
        yield
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            try:
                (CPU_V1 / "cgroup.procs").write_text(pid)
            except ProcessLookupError:
                pass
        group.rmdir()


def test_a_straggler_node_is_replaced_at_a_checkpoint(torch_ready, make_slurm, tmp_path):
    """Three nodes (the straggler score needs at least three to compare) and a spare. One node's
    CPU is capped from step 30: its rank's compute time rises ~10x; the supervisor names it,
    restarts the run at the next verified checkpoint without it and drains it."""
    if not (CPU_V1 / "cpu.cfs_quota_us").exists():
        pytest.skip("no cgroup v1 cpu controller to slow a node with")
    slurm_cluster = make_slurm(5, extra_conf={"KillWait": "5"})
    root = tmp_path / "ckpt"
    root.mkdir()
    run = TorchRun(
        tmp_path,
        slurm_cluster.partition,
        str(root),
        nodes=3,
        spares=slurm_cluster.nodes[-1],
        train_args=["--steps", "120", "--ckpt-every", "20", "--min-step-s", "0.1"],
    )
    run.write_corpus()
    spec = run.spec(checkpoints="full_verify = false\n")
    sup = SupervisorProcess(slurm_cluster, tmp_path)
    sup.start()
    try:
        sup.cli("submit", str(spec))
        first = sup.wait_running("gpt", attempt=0, interval=0.5)
        wait_for("step 30 trained", lambda: last_step(run, 0) >= 30, 120, sup, interval=0.05)
        slow = first["running_on"][1]
        pids = [p for p in slurm_cluster.node_pids(slow) if p != slurm_cluster.slurmd_pid(slow)]
        with throttled(pids):
            slowed_at = last_step(run, 0)
            wait_for("a restart", lambda: sup.status("gpt")["attempt"] >= 1, 90, sup)
        wait_for("the run completed", lambda: completed(sup), 90, sup, interval=1.0)
    finally:
        sup.stop()
    book = sup.logbook("gpt")
    degraded = [e for e in book if e["kind"] == "node_degraded"]
    assert degraded and "straggler" in degraded[0]["message"] and slow in degraded[0]["message"], timeline(sup)
    final = sup.status("gpt")["attempts"][-1]
    assert slow not in final["nodes"] and slurm_cluster.nodes[-1] in final["nodes"], final
    restarted = next(e for e in book if e["kind"] == "restarted")
    resumed = restarted["evidence"]["resume_step"]
    assert resumed >= slowed_at // 20 * 20, (resumed, slowed_at)
    last_attempt = str(final["seq"])
    trained = [e["step"] for e in run.trace() if e.get("attempt") == last_attempt and not e.get("skipped")]
    assert trained[0] == resumed + 1 and trained[-1] == 120, trained
    drained = [e["evidence"]["node"] for e in book if e["kind"] == "node_drained"]
    assert drained == [slow], timeline(sup)  # only the straggler (a node never probed at a port not its own)
    assert not any(e["kind"] == "backoff" for e in book), timeline(sup)  # dropping a degraded node is no fast failure


def test_bad_arguments_exit_93_through_torchrun_and_the_run_is_not_restarted(torch_ready, slurm_cluster, tmp_path):
    """torchrun itself exits 1 for any failed worker; train.sbatch hands on rank 0's own code."""
    run = TorchRun(tmp_path, slurm_cluster.partition, str(tmp_path / "ckpt"), train_args=["--steps", "0"])
    spec = run.spec()
    sup = SupervisorProcess(slurm_cluster, tmp_path)
    sup.start()
    try:
        sup.cli("submit", str(spec))
        wait_for("the run failed", lambda: sup.status("gpt")["state"] == "failed", 90, sup, interval=1.0)
    finally:
        sup.stop()
    status = sup.status("gpt")
    assert status["attempts"][-1]["exit_code"] == 93 and status["restarts"]["spent"] == 0, status
