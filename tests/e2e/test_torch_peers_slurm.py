"""FSDP with no replica (2 nodes x 2 ranks, examples/torch/train.py ``--layout fsdp --peer-copies
5``) under the real daemon on a real Slurm, in-allocation with a hot spare: a node crashes between
two periodic saves and its host memory is gone. The daemon swaps in the spare and relaunches the
step, offering the newest verified storage checkpoint and naming the newer generation of peer
copies its log reported; the relaunched world restores that generation from the survivors' memory (their own copies, and the dead node's that they held as its
buddies) without reading that checkpoint, and the run ends with exactly an uninterrupted run's
tensors, and the logbook says which generation it restored instead of which checkpoint. The memory restore's time and a storage restore's of the same state are printed.
Host tier only (``torch``)."""

from __future__ import annotations

import re

import pytest

from supervisor.testing.torch.sharded_scenarios import PEER_STEPS, peers_node_crash
from supervisor.testing.torch.torch_world import LocalWorld, dcp_tensors

pytestmark = [pytest.mark.slurm, pytest.mark.torch]


def test_a_node_crash_without_replicas_restores_from_peer_copies_not_storage(torch_ready, slurm_cluster, tmp_path):
    import torch

    out = peers_node_crash(slurm_cluster, tmp_path / "crash")
    explain = out.story()
    said = "\n".join(p.read_text() for p in sorted((tmp_path / "crash").glob("gpt-*.out")))
    memory = re.search(r"restored step (\d+) from memory in ([0-9.]+) s \((\d+) bytes moved\)", said)
    assert memory, said[-4000:] + explain
    restored = int(memory[1])
    crashed_at = int(out.marks["crash_step"])
    assert restored == crashed_at // 5 * 5 and restored % 20, (restored, crashed_at)  # newer than storage's 40
    assert int(memory[3]) > 0 and "from storage" not in said  # the dead node's shards came over the network
    swapped = [e["message"] for e in out.events("note") if "hot spare" in e["message"]]
    assert swapped and f"resuming from step {restored // 20 * 20} " in swapped[0], explain  # what it was offered
    assert f"peer copies in memory hold step {restored} " in swapped[0], explain  # and the generation it named
    (note,) = [e for e in out.events("note") if "from peer copies" in e["message"]]
    assert f"restored step {restored} from peer copies in memory (generation {restored}," in note["message"]
    assert f"instead of the checkpoint at step {restored // 20 * 20}" in note["message"], explain
    after = out.run.trained(0, generation=1)
    assert [e["step"] for e in after] == list(range(restored + 1, PEER_STEPS + 1)), explain
    assert out.status["attempt"] == 0, out.status  # the same job

    # the last state is an uninterrupted run's, tensor for tensor
    ref = tmp_path / "reference"
    ref.mkdir()
    (ref / "corpus.bin").write_bytes(out.run.data_path.read_bytes())
    args = ["--layout", "fsdp", "--steps", str(PEER_STEPS), "--ckpt-every", str(PEER_STEPS)]
    world = LocalWorld(ref, "reference", [*args, "--root", str(ref / "ckpt")], ranks=4, per_node=2)
    assert world.run() == [0] * 4, world.log(0)[-2000:]
    ours = dcp_tensors(tmp_path / "crash" / "ckpt" / f"step_{PEER_STEPS:06d}")
    theirs = dcp_tensors(ref / "ckpt" / f"step_{PEER_STEPS:06d}")
    assert ours.keys() == theirs.keys() and len(ours) > 10
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)

    # a storage restore of the same state (the same tensors, the checkpoint the daemon offered)
    offered = tmp_path / "crash" / "ckpt" / f"step_{restored // 20 * 20:06d}"
    env = {"SSV_RESUME_CHECKPOINT": str(offered), "SSV_RESUME_STEP": str(restored // 20 * 20)}
    one_more = ["--layout", "fsdp", "--steps", str(restored // 20 * 20 + 1), "--root", str(ref / "again")]
    storage = LocalWorld(ref, "storage", one_more, ranks=4, per_node=2, env=env)
    assert storage.run() == [0] * 4, storage.log(0)[-2000:]
    read = re.search(r"restored step \d+ from storage in ([0-9.]+) s", storage.log(0))
    assert read, storage.log(0)[-2000:]
    print(f"restore of the same state: from peers' memory {memory[2]} s, from storage {read[1]} s")
