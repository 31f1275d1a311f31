"""Save on failure for a sharded state (supervisor.telemetry.torch_sharded) with examples/torch/train.py
``--layout hsdp`` in four local gloo processes, no Slurm: FSDP2 over a 2-D mesh, each "node" (two
ranks) one replica group, the state sharded over its two ranks. Node n2's ranks are killed mid-run
(the node crashed); n1's two ranks each hold one shard of the last completed step, each writes its
own, one merges the parts and commits the manifest; the daemon's verification accepts it; it holds
exactly an uninterrupted run's state at that step, and a fresh four-rank world resumes from it and
trains on as that run did. The same on real Slurm under the daemon: tests/e2e/test_torch_sharded_slurm.py."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI", "").lower() != "true" else __import__("torch")

from supervisor.adapters.checkpoints.posix import PosixBackend  # noqa: E402
from supervisor.adapters.checkpoints.store import BackendCheckpointStore  # noqa: E402
from supervisor.domain.checkpoints.manifest import Guarantee, Level, Outcome  # noqa: E402
from supervisor.telemetry.torch_sharded import create_once  # noqa: E402
from supervisor.testing.torch.torch_world import LocalWorld, dcp_tensors  # noqa: E402

STEPS = 14
HSDP = ["--layout", "hsdp", "--steps", str(STEPS)]


def losses(trace: Path) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in map(json.loads, trace.read_text().splitlines()) if "loss" in e}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, dict[int, float]]:
    """An uninterrupted HSDP run that saves every step: (its checkpoint root, its losses)."""
    tmp = tmp_path_factory.mktemp("reference")
    world = LocalWorld(tmp, "reference", [*HSDP, "--root", str(tmp / "ckpt"), "--ckpt-every", "1"], 4, 2)
    assert world.run() == [0] * 4, world.log(0)[-2000:]
    return tmp / "ckpt", losses(world.trace)


def test_create_once_has_one_winner_and_its_whole_body(tmp_path):
    path = tmp_path / "claim"
    assert create_once(path, b"first") and not create_once(path, b"second")
    assert path.read_bytes() == b"first" and [p.name for p in tmp_path.iterdir()] == ["claim"]


def test_a_dead_replica_group_leaves_every_shard_saved_by_the_other_and_a_new_world_resumes(tmp_path, reference):
    root = tmp_path / "ckpt"
    args = [*HSDP, "--root", str(root), "--ckpt-every", "5", "--save-on-failure", "--min-step-s", "0.1"]
    world = LocalWorld(tmp_path, "failed", args, 4, 2, env={"SSV_SAVE_ON_FAILURE_S": "30"}).start()
    world.kill_node("n2", lambda: world.steps_traced() >= 7)
    codes = world.wait()
    said = [re.search(r"stopped: a peer failed: .*; (saved(?: and committed)?) step (\d+), shard (\d) of 2", world.log(r))
            for r in (0, 1)]  # fmt: skip
    assert codes[:2] == [1, 1] and all(said), world.log(0)[-3000:] + world.log(1)[-3000:]
    assert sorted(m[3] for m in said if m) == ["0", "1"]  # one writer per shard
    assert [m[1] for m in said if m].count("saved and committed") == 1  # one of them merged and committed
    saved = int(said[0][2]) if said[0] else 0
    assert 7 <= saved < 10 and {int(m[2]) for m in said if m} == {saved}

    # the daemon finds it committed, with our manifest, and verifies every byte
    store = BackendCheckpointStore(PosixBackend(str(root)))
    ref = next(r for r in store.discover() if r.step == saved)
    assert ref.committed and ref.guarantee is Guarantee.MANIFEST, ref
    assert store.verify(ref, Level.FULL).outcome is Outcome.VERIFIED

    # it holds exactly the uninterrupted run's state at that step, every shard of it
    ref_root, ref_losses = reference
    ours, theirs = dcp_tensors(root / f"step_{saved:06d}"), dcp_tensors(ref_root / f"step_{saved:06d}")
    assert ours.keys() == theirs.keys() and len(ours) > 10
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)

    # a fresh four-rank world resumes from it and trains on as the uninterrupted run did
    resume = {"SSV_RESUME_CHECKPOINT": str(root / f"step_{saved:06d}"), "SSV_RESUME_STEP": str(saved)}
    after = LocalWorld(tmp_path, "resumed", [*HSDP, "--root", str(root), "--ckpt-every", "50"], 4, 2, env=resume)
    assert after.run() == [0] * 4, after.log(0)[-2000:]
    trained = losses(after.trace)
    assert sorted(trained) == list(range(saved + 1, STEPS + 1))
    assert all(trained[s] == pytest.approx(ref_losses[s], rel=1e-6) for s in trained), (trained, ref_losses)
