"""Save on failure (supervisor.telemetry.torch_survivors) with examples/torch/train.py in two local
gloo processes, no Slurm: one rank exits mid-step (a GPU fault's crash); the survivor saves the
step it completed, alone, with the supervisor's manifest; the daemon's verification accepts it; it
holds exactly an uninterrupted run's state at that step, and a fresh two-rank world resumes from it
and trains on as that run did.

* rank 1 dies in step 23's compute (before the gradients' all-reduce): the survivor's state is
  step 22's; it claims on the c10d store (rank 0 hosts it), then on the storage.
* rank 0 dies after step 23's update (before its telemetry all-gather): step 23's; rank 0 took the
  c10d store with it, so the claim is the file on the checkpoint storage alone.
* SIGTERM to one rank: held to its step's end, where that rank saves; the other writes nothing.
* On S3 (Ceph RGW): the claim is a conditional PUT the server honours, and the survivor's
  checkpoint in the bucket passes the daemon's verification."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI", "").lower() != "true" else __import__("torch")

from supervisor.adapters.checkpoints.posix import PosixBackend  # noqa: E402
from supervisor.adapters.checkpoints.s3 import S3Backend  # noqa: E402
from supervisor.adapters.checkpoints.store import BackendCheckpointStore  # noqa: E402
from supervisor.domain.checkpoints.manifest import Guarantee, Level, Outcome  # noqa: E402
from supervisor.telemetry.torch_survivors import CLAIM_PREFIX, _claim_file, claim_name, peer_failure  # noqa: E402
from supervisor.testing.torch.torchrun import EXAMPLE, TorchRun  # noqa: E402

STEPS, EVERY = 26, 10


def test_a_dead_peer_is_told_from_a_ranks_own_error():
    gloo = "[../gloo/transport/tcp/pair.cc:537] Read error [10.0.0.2]:4242: Connection reset by peer."
    assert peer_failure(RuntimeError(gloo)) and peer_failure(torch.distributed.DistBackendError("NCCL error"))
    assert peer_failure(RuntimeError("Connection closed by peer [10.0.0.2]:4242"))
    for own in (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), ValueError("reset"), KeyboardInterrupt()):
        assert peer_failure(own) is None, own


def test_the_claim_file_is_one_per_world():
    env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "MASTER_ADDR": "n1", "MASTER_PORT": "29500"}
    again = {**env, "SSV_STEP_GENERATION": "1"}  # the step relaunched in place: another world
    assert claim_name(env) == claim_name(dict(env)) != claim_name(again)
    assert claim_name(env).startswith(CLAIM_PREFIX) and "/" not in claim_name(env)


def test_the_claim_file_cannot_be_named_by_someone_without_the_jobs_secrets():
    """Issue 32, finding 7 (and 16): another account that may write the checkpoint root knows the job's
    id, step and master address; it cannot know the run's manifest key or the launcher's nonce."""
    env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "MASTER_ADDR": "n1", "MASTER_PORT": "29500"}
    keyed = {**env, "SSV_MANIFEST_KEY": "ab" * 32}
    assert claim_name(keyed) != claim_name(env) != claim_name({**keyed, "SSV_WORLD_NONCE": "cd" * 16})
    assert claim_name(keyed) == claim_name(dict(keyed))


def test_a_stranger_who_bumps_the_stores_counter_does_not_silence_the_save(tmp_path: Path):
    """The c10d store has no authentication: a count taken before the survivors ask is a stranger's.
    The storage alone decides, so the survivor still saves."""
    from supervisor.telemetry.torch import Supervision
    from supervisor.telemetry.torch_survivors import CLAIM_KEY, SaveOnFailure

    store = torch.distributed.HashStore()
    store.add(CLAIM_KEY, 1)  # the stranger's
    ssv = Supervision(str(tmp_path / "ckpt"))
    claimed, how = SaveOnFailure(ssv, {}, store=store, handle_sigterm=False)._claim(5, "a peer failed")
    assert claimed and "claimed on the storage" in how, how
    again, how = SaveOnFailure(ssv, {}, store=store, handle_sigterm=False)._claim(5, "a peer failed")
    assert not again and "on the storage" in how


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def world(tmp: Path, name: str, root: Path, extra: list[str], env: dict[str, str] | None = None) -> list[int]:
    """train.py on two local ranks ("nodes" n1 and n2) until both exit; their exit codes."""
    return [p.wait(timeout=120) for p in start(tmp, name, root, extra, env)]


def start(
    tmp: Path, name: str, root: Path, extra: list[str], env: dict[str, str] | None = None
) -> list[subprocess.Popen[bytes]]:
    """train.py on two local ranks, started; each rank's output in ``tmp/NAME-RANK.log``."""
    data = tmp / "corpus.bin"
    if not data.exists():
        TorchRun(tmp, "none", str(root)).write_corpus()
    port = str(free_port())
    args = ["--root", str(root), "--data", str(data), "--steps", str(STEPS), "--ckpt-every", str(EVERY), *extra]
    procs = []
    for rank in (0, 1):
        rank_env = {
            **os.environ,
            **(env or {}),
            "RANK": str(rank),
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "GLOO_SOCKET_IFNAME": "lo",
            "OMP_NUM_THREADS": "1",
            "SLURMD_NODENAME": f"n{rank + 1}",
            "SSV_SAVE_ON_FAILURE_S": "30",
        }
        log = (tmp / f"{name}-{rank}.log").open("w")
        argv = [sys.executable, str(EXAMPLE / "train.py"), *args]
        procs.append(subprocess.Popen(argv, env=rank_env, stdout=log, stderr=subprocess.STDOUT))
    return procs


def losses(trace: Path) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in map(json.loads, trace.read_text().splitlines()) if "loss" in e}


def weights(location: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a DCP checkpoint, loaded in this process."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = location.parent / f"{location.name}.pt"
    dcp_to_torch_save(str(location), str(out))
    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)
        elif isinstance(value, torch.Tensor):
            flat[prefix] = value

    walk("", torch.load(out, weights_only=False))
    return flat


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, dict[int, float]]:
    """An uninterrupted run that saves every step: (its checkpoint root, its losses)."""
    tmp = tmp_path_factory.mktemp("reference")
    root = tmp / "ckpt"
    codes = world(tmp, "reference", root, ["--ckpt-every", "1", "--trace", str(tmp / "trace.jsonl")])
    assert codes == [0, 0], (tmp / "reference-0.log").read_text()[-2000:]
    return root, losses(tmp / "trace.jsonl")


@pytest.mark.parametrize(
    ("dies", "when", "saved", "writer", "claim"),
    [("n2", "", 22, 0, "claimed on the store"), ("n1", "after-update", 23, 1, "store unreachable")],
    ids=["rank1-before-update", "rank0-after-update-store-gone"],
)
def test_the_survivor_saves_its_last_completed_step_and_a_new_world_resumes_from_it(
    tmp_path, reference, dies, when, saved, writer, claim
):
    root = tmp_path / "ckpt"
    die = tmp_path / "die"
    die.write_text(f"{dies} 23 {when}")
    codes = world(tmp_path, "failed", root, ["--save-on-failure", "--die-file", str(die)])
    out = (tmp_path / f"failed-{writer}.log").read_text()
    assert codes == [1, 1], out[-3000:]
    assert f"saved step {saved}" in out and claim in out, out[-3000:]
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step_")) == [
        "step_000010",
        "step_000020",
        f"step_{saved:06d}",
    ]
    assert [p.name.startswith(CLAIM_PREFIX) for p in root.iterdir()].count(True) == 1
    check(tmp_path, root, saved, reference, resume=writer == 0)


def check(
    tmp_path: Path, root: Path, saved: int, reference: tuple[Path, dict[int, float]], *, resume: bool = False
) -> None:
    """Step ``saved``'s checkpoint is committed, verified, and holds the reference's state at that
    step; with ``resume``, a new world resumes from it and trains on as the reference did."""
    # the daemon's store finds it committed, with our manifest, and its verification accepts it
    store = BackendCheckpointStore(PosixBackend(str(root)))
    refs = store.discover()
    assert all(r.name.startswith("step_") for r in refs), refs  # the claim file is no checkpoint
    ref = next(r for r in refs if r.step == saved)
    assert ref.committed and ref.guarantee is Guarantee.MANIFEST, ref
    for level in (Level.METADATA, Level.FULL):
        assert store.verify(ref, level).outcome is Outcome.VERIFIED

    # it holds exactly the uninterrupted run's state at that step
    ref_root, ref_losses = reference
    ours, theirs = weights(root / f"step_{saved:06d}"), weights(ref_root / f"step_{saved:06d}")
    assert ours.keys() == theirs.keys() and len(ours) > 10
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)

    if not resume:
        return
    # a fresh two-rank world resumes from it and trains on as the uninterrupted run did
    resume = {"SSV_RESUME_CHECKPOINT": str(root / f"step_{saved:06d}"), "SSV_RESUME_STEP": str(saved)}
    codes = world(tmp_path, "resumed", root, ["--trace", str(tmp_path / "after.jsonl")], env=resume)
    assert codes == [0, 0], (tmp_path / "resumed-0.log").read_text()[-2000:]
    after = losses(tmp_path / "after.jsonl")
    assert sorted(after) == list(range(saved + 1, STEPS + 1))
    assert all(after[s] == pytest.approx(ref_losses[s], rel=1e-6) for s in after), (after, ref_losses)


def test_a_sigterm_is_held_to_the_end_of_the_step_which_one_rank_saves(tmp_path, reference):
    """srun's --kill-on-bad-exit, torchrun stopping its workers, a scancel: SIGTERM to one rank mid
    run. It is not let through halfway into an optimizer step: at its step's end the rank saves
    that step and stops; the other rank's next collective fails, it claims too, and writes nothing."""
    root = tmp_path / "ckpt"
    procs = start(tmp_path, "failed", root, ["--save-on-failure", "--min-step-s", "0.1"])
    began = time.monotonic()
    while not list(root.glob("step_000010/ssv-manifest.json")) and time.monotonic() - began < 60:
        time.sleep(0.05)
    procs[1].send_signal(signal.SIGTERM)
    codes = [p.wait(timeout=120) for p in procs]
    out = (tmp_path / "failed-1.log").read_text()
    assert codes == [1, 1], out[-3000:]
    said = re.search(r"stopped: SIGTERM; saved step (\d+) \(claimed on the store and the storage\)", out)
    assert said and "held until the step ends" in out, out[-3000:]
    loser = (tmp_path / "failed-0.log").read_text()
    assert "a peer failed" in loser and "another survivor claimed it on the store" in loser, loser[-3000:]
    saved = int(said[1])
    assert 10 <= saved < STEPS
    check(tmp_path, root, saved, reference)


def test_on_s3_one_claim_wins_and_the_survivors_checkpoint_passes_verification(tmp_path, ceph_rgw, monkeypatch):
    bucket = f"sof-{uuid.uuid4().hex[:8]}"
    ceph_rgw.create_bucket(bucket)
    root = f"s3://{bucket}/gpt/"
    for key, value in ceph_rgw.credentials_env().items():
        monkeypatch.setenv(key, value)
    die = tmp_path / "die"
    die.write_text("n2 23")
    env = {"AWS_ENDPOINT_URL": ceph_rgw.endpoint_url}
    codes = world(tmp_path, "failed", root, ["--save-on-failure", "--die-file", str(die)], env)  # type: ignore[arg-type]
    out = (tmp_path / "failed-0.log").read_text()
    assert codes == [1, 1] and "saved step 22 (claimed on the store and the storage)" in out, out[-3000:]
    store = BackendCheckpointStore(S3Backend(root, endpoint_url=ceph_rgw.endpoint_url))
    ref = next(r for r in store.discover() if r.step == 22)
    assert ref.committed and ref.guarantee is Guarantee.MANIFEST, ref
    assert store.verify(ref, Level.FULL).outcome is Outcome.VERIFIED
    # the storage is the arbiter when the c10d store is gone: a second claim on the name loses
    late = SimpleNamespace(root=root, endpoint_url=ceph_rgw.endpoint_url)
    name = f"{CLAIM_PREFIX}test-{uuid.uuid4().hex[:8]}"
    assert _claim_file(late, name, b"first") and not _claim_file(late, name, b"second")  # type: ignore[arg-type]
