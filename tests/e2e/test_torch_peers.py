"""In-memory peer copies (supervisor.telemetry.torch_peers) with examples/torch/train.py ``--layout
fsdp --peer-copies 5`` in four local gloo processes, no Slurm: the state sharded over all four ranks,
no replica. Node n2's two ranks are killed mid-run and its memory is gone; a new world on n1 and a
spare n3 restores the newest complete generation from memory — n1's own copies read there, n2's
sent from n1, where they were its buddies' — without the storage checkpoint it was offered, and
trains on to exactly an uninterrupted run's state. The same under the daemon on real Slurm:
tests/e2e/test_torch_peers_slurm.py."""

from __future__ import annotations

import os
import re
import shutil

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI", "").lower() != "true" else __import__("torch")

from supervisor.testing.torch.torch_world import LocalWorld, dcp_tensors  # noqa: E402

STEPS, EVERY = 20, 5
FSDP = ["--layout", "fsdp", "--steps", str(STEPS), "--ckpt-every", "10"]


def test_a_dead_nodes_shards_come_back_from_its_buddys_memory_and_the_run_ends_as_an_uninterrupted_one(tmp_path):
    shm, root = tmp_path / "shm", tmp_path / "ckpt"
    args = [*FSDP, "--root", str(root), "--peer-copies", str(EVERY), "--min-step-s", "0.1"]
    env = {"SSV_PEER_DIR": str(shm)}
    first = LocalWorld(tmp_path, "first", args, 4, 2, env=env).start()
    first.kill_node("n2", lambda: first.steps_traced() >= 17)
    shutil.rmtree(shm / "ssv-peers-local-n2")  # the node's memory went with it
    assert first.wait()[2:] == [-9, -9]
    reported = [int(s) for s in re.findall(r'"event": "memory_checkpoint", "generation": (\d+)', first.log(0))]
    assert reported and reported[-1] == 15, reported  # 5, 10, 15: the newest complete generation

    offered = {"SSV_RESUME_CHECKPOINT": str(root / "step_000010"), "SSV_RESUME_STEP": "10"}
    shutil.rmtree(root / "step_000010")  # not read: restoring from it would fail
    second = LocalWorld(tmp_path, "second", args, 4, 2, env={**env, **offered}, nodes=("n1", "n3"))
    assert second.run() == [0] * 4, second.log(0)[-3000:]
    said = re.search(r"restored step (\d+) from memory in ([0-9.]+) s \((\d+) bytes moved\)", second.log(0))
    assert said and said[1] == "15" and int(said[3]) > 0, second.log(0)[-3000:]
    assert "from storage" not in second.log(0)

    reference = LocalWorld(tmp_path, "reference", [*FSDP, "--root", str(tmp_path / "ref")], 4, 2, env=env)
    assert reference.run() == [0] * 4, reference.log(0)[-2000:]
    ours, theirs = dcp_tensors(root / f"step_{STEPS:06d}"), dcp_tensors(tmp_path / "ref" / f"step_{STEPS:06d}")
    assert ours.keys() == theirs.keys() and len(ours) > 10
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert not any(shm.iterdir())  # a run that completed leaves nothing in host memory
