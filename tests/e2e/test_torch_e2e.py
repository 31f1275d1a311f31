"""Real training under the real daemon on a real Slurm: examples/torch/train.py (a tiny GPT, two
nodes, torchrun + gloo, DCP checkpoints committed with the supervisor's manifest, in the harness's
Ceph RGW for the first two). The scenarios' steps are supervisor.testing.torch.torch_scenarios' (shared
with bench/e2e.py); the assertions are here.

* A checkpoint corrupted at rest, then a node crash mid-training: the newest checkpoint's shard is
  overwritten in Ceph once the trainer is past it; the supervisor finds it corrupt, and when the
  batch host crashes the run resumes on healthy nodes from the checkpoint before it, its loss there
  where it was, its sample counter continuing from the checkpoint.
* Poisoned batches (planted in the corpus) make a loss spike that does not heal: the supervisor
  rolls back to a verified checkpoint before it and the restarted trainer never trains on them.
* One node of three is made 10 % slower (every rank's compute sleeps 0.2 s, a GPU's share of the
  step; that node's 10 % longer): it is named a straggler from the ranks' compute times, and the
  run moves past it at a checkpoint boundary.
* In-allocation mode with ``--save-on-failure``: one node's rank exits mid-step between two
  periodic saves; the surviving rank saves the step it completed and the step is relaunched in
  place from it (without the flag: from the periodic save before).

Steps are paced at 0.1 s (``--min-step-s``) so that the supervisor's 0.5 s polls see the run
step by step; each test takes ~50-100 s here (2 shared cores, other test runs beside).
"""

from __future__ import annotations

import re
import statistics
from typing import Any

import pytest

from supervisor.testing.slurm.daemon import SupervisorProcess
from supervisor.testing.torch import torch_scenarios as scenarios
from supervisor.testing.torch.torch_scenarios import GLOBAL_BATCH, POISON, completed, last_step, timeline, wait_for
from supervisor.testing.torch.torchrun import TorchRun

pytestmark = [pytest.mark.slurm, pytest.mark.torch]


def losses(entries: list[dict[str, Any]]) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in entries}


def test_a_corrupt_checkpoint_is_passed_over_and_a_node_crash_resumes_from_the_one_before(
    torch_ready, slurm_cluster, ceph_rgw, tmp_path
):
    plan = scenarios.CORRUPT_CRASH
    out = scenarios.crash(slurm_cluster, ceph_rgw, tmp_path, plan)
    run = out.run
    explain = out.story()
    corrupt_step, before = plan.corrupt_step, plan.corrupt_step - plan.every

    # the supervisor looked again at the rewritten shard and found it corrupt, naming it
    found = [e["evidence"] for e in out.events("checkpoint_corrupt") if e["evidence"]["step"] == corrupt_step]
    assert found, explain
    assert found[-1]["level"] == "full" and out.corrupted_key is not None
    shard = out.corrupted_key.rsplit("/", 1)[-1]
    assert [(p["key"], p["problem"]) for p in found[-1]["problems"]] == [(shard, "checksum")], found[-1]
    # ... and at the restart passed it over, saying why, for the verified one before it
    restarted = out.events("restarted")[0]
    assert restarted["evidence"]["resume_step"] == before, explain
    assert f"step {corrupt_step} skipped: full verification: corrupt" in restarted["message"], restarted["message"]
    assert restarted["evidence"]["resume"]["checkpoint"]["guarantee"] == "manifest", restarted
    assert [e["evidence"]["node"] for e in out.events("node_drained")] == [out.victim], explain
    # the resumed job saved that step again under a name of its own, and the supervisor verified it
    resaved = {e["evidence"]["location"].rstrip("/").rsplit("/", 1)[-1] for e in out.events("checkpoint_verified")}
    assert f"{scenarios.checkpoint_name(corrupt_step)}-b" in resaved, explain

    before_crash, after = run.trained(0), run.trained(1)
    last_before = before_crash[-1]["step"]
    assert corrupt_step < last_before < corrupt_step + plan.every, (last_before, "the crash came after the next save")
    steps_after = [e["step"] for e in after]
    assert steps_after == list(range(before + 1, plan.steps + 1)), steps_after  # no batch repeated, none lost
    assert [e["consumed_samples"] for e in after] == [s * GLOBAL_BATCH for s in steps_after]
    # the work lost is what the logbook says: the steps past the checkpoint that attempt 0 reached
    assert abs(restarted["evidence"]["last_step"] - last_before) <= 1, (restarted["evidence"], last_before)

    loss0, loss1 = losses(before_crash), losses(after)
    noise = statistics.stdev([loss0[s] for s in range(before - 9, before + 1)])
    assert abs(loss1[before + 1] - loss0[before]) <= 3 * noise, (loss1[before + 1], loss0[before], noise)
    # the same weights, optimizer state and batch: the first step after the resume replays attempt 0's
    assert loss1[before + 1] == pytest.approx(loss0[before + 1], rel=1e-4)


def test_an_unhealed_spike_from_poisoned_batches_is_rolled_back_and_the_batches_skipped(
    torch_ready, slurm_cluster, ceph_rgw, tmp_path
):
    out = scenarios.spike(slurm_cluster, ceph_rgw, tmp_path)
    run = out.run
    explain = out.story()
    rollback = out.events("rollback")[0]["evidence"]
    assert rollback["onset_step"] in (POISON[0], POISON[0] + 1) and rollback["checkpoint_step"] == 60, rollback
    first_skipped, last_skipped = rollback["skip_first"], rollback["skip_last"]
    assert first_skipped == 61 and last_skipped >= POISON[1], rollback
    restarted = out.events("restarted")[0]
    assert f"skipping iterations {first_skipped}-{last_skipped}" in restarted["message"], restarted["message"]
    assert out.events("spike"), explain
    assert not out.events("backoff"), explain  # a rollback is no fast failure

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


def test_a_straggler_node_is_replaced_at_a_checkpoint(torch_ready, make_slurm, tmp_path):
    """Three nodes (the straggler score needs at least three to compare) and a spare. Each rank's
    compute sleeps 0.2 s (a GPU's share of the step: long beside the tiny model's few ms of CPU,
    whose jitter on a loaded CI machine hid a 2 ms difference at 20 ms); from step 30 one node's
    sleeps 10 % longer (the issue's straggler: a GPU with falling clocks); the supervisor names it,
    says it is ~10 % slower, restarts the run at the next verified checkpoint without it and drains it."""
    slurm_cluster = make_slurm(5, extra_conf={"KillWait": "5"})
    root = tmp_path / "ckpt"
    root.mkdir()
    run = TorchRun(
        tmp_path,
        slurm_cluster.partition,
        str(root),
        nodes=3,
        spares=slurm_cluster.nodes[-1],
        train_args=[
            "--steps",
            "120",
            "--ckpt-every",
            "20",
            "--compute-s",
            "0.2",
            "--straggler-file",
            str(tmp_path / "straggler"),
        ],
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
        (tmp_path / "straggler").write_text(f"{slow} 0.10")
        slowed_at = last_step(run, 0)
        wait_for("a restart", lambda: sup.status("gpt")["attempt"] >= 1, 90, sup)
        wait_for("the run completed", lambda: completed(sup), 90, sup, interval=1.0)
    finally:
        sup.stop()
    book = sup.logbook("gpt")
    degraded = [e for e in book if e["kind"] == "node_degraded"]
    assert degraded and "straggler" in degraded[0]["message"] and slow in degraded[0]["message"], timeline(sup)
    said = re.search(r"step time ([0-9.]+)% above", degraded[0]["message"])
    assert said and 7.0 <= float(said[1]) <= 13.0, degraded[0]["message"]  # it says how much slower: ~10 %
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


def test_a_rank_that_dies_mid_step_resumes_in_place_from_the_survivors_save(torch_ready, slurm_cluster, tmp_path):
    """In-allocation mode, ``--save-on-failure``: between the periodic saves at 40 and 60 one node's
    rank exits mid-step N (a GPU fault's crash); the surviving rank saves step N-1, the state it had
    completed, alone; the daemon relaunches the step in place from it: ~one step lost, not N-41."""
    out = scenarios.survivors(slurm_cluster, tmp_path)
    explain = out.story()
    died_in = int(out.marks["die_step"])
    relaunched = [e for e in out.events("note") if e["evidence"].get("relaunch")]
    assert len(relaunched) == 1, explain
    resumed = relaunched[0]["evidence"]["resume_step"]
    assert resumed > 40 and died_in - 2 <= resumed <= died_in - 1, (resumed, died_in, explain)
    before, after = out.run.trained(0, generation=0), out.run.trained(0, generation=1)
    assert before[-1]["step"] == died_in - 1, before[-1]  # the last step the dead rank's world completed
    assert [e["step"] for e in after] == list(range(resumed + 1, 81)), [e["step"] for e in after]
    assert [e["consumed_samples"] for e in after] == [e["step"] * GLOBAL_BATCH for e in after]
    assert out.status["attempt"] == 0 and out.status["restarts"]["spent"] == 1, out.status  # the same job
    saved = sorted(p.parent.name for p in (tmp_path / "ckpt").glob("step_*/ssv-manifest.json"))
    assert saved == ["step_000020", "step_000040", f"step_{resumed:06d}", "step_000060", "step_000080"], saved
    lost = min(float(e["time"]) for e in after) - out.marks["died"]
    print(f"save on failure: died in step {died_in}, resumed from {resumed}; {lost:.1f} s to training again")
