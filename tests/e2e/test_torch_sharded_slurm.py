"""A sharded state (FSDP2 HSDP over gloo: 2 nodes x 2 ranks, examples/torch/train.py ``--layout
hsdp``) under the real daemon on a real Slurm: a node crashes mid-step between two periodic saves;
the other node's replica group saves every shard of the step it completed (one rank per shard,
committed with the supervisor's manifest); the daemon verifies it and restarts the run on the
healthy node and the spare from it; the run ends with exactly the state an uninterrupted run has.
Host tier only (``torch``): scripts/slurm-release leaves torch out of the other releases' tiers."""

from __future__ import annotations

import pytest

from supervisor.testing.torch.sharded_scenarios import HSDP_STEPS, hsdp_node_crash
from supervisor.testing.torch.torch_scenarios import GLOBAL_BATCH
from supervisor.testing.torch.torch_world import LocalWorld, dcp_tensors

pytestmark = [pytest.mark.slurm, pytest.mark.torch]


def test_a_node_crash_under_hsdp_resumes_from_the_step_before_it_with_an_uninterrupted_runs_state(
    torch_ready, slurm_cluster, tmp_path
):
    import torch

    out = hsdp_node_crash(slurm_cluster, tmp_path / "crash")
    explain = out.story()
    restarted = out.events("restarted")[0]["evidence"]
    before = out.run.trained(0)
    resumed = restarted["resume_step"]
    # the replica group that lived saved the last step it completed: nothing trained is lost
    assert resumed == before[-1]["step"] and resumed > 20 and resumed % 20, (resumed, before[-1], explain)
    assert abs(resumed - out.marks["crash_step"]) <= 2, (resumed, out.marks)
    after = out.run.trained(1)
    assert [e["step"] for e in after] == list(range(resumed + 1, HSDP_STEPS + 1))
    assert [e["consumed_samples"] for e in after] == [e["step"] * 2 * GLOBAL_BATCH for e in after]
    assert [e["evidence"]["node"] for e in out.events("node_drained")] == [out.victim], explain

    # the run's last state is an uninterrupted run's, tensor for tensor (same layout, 4 local ranks)
    ref = tmp_path / "reference"
    ref.mkdir()
    args = [
        "--layout",
        "hsdp",
        "--steps",
        str(HSDP_STEPS),
        "--ckpt-every",
        str(HSDP_STEPS),
        "--root",
        str(ref / "ckpt"),
    ]
    (ref / "corpus.bin").write_bytes(out.run.data_path.read_bytes())
    world = LocalWorld(ref, "reference", args, ranks=4, per_node=2)
    assert world.run() == [0] * 4, world.log(0)[-2000:]
    ours = dcp_tensors(tmp_path / "crash" / "ckpt" / f"step_{HSDP_STEPS:06d}")
    theirs = dcp_tensors(ref / "ckpt" / f"step_{HSDP_STEPS:06d}")
    assert ours.keys() == theirs.keys() and len(ours) > 10
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
