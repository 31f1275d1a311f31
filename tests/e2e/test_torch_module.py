"""supervisor.telemetry.torch in one process (world size 1, gloo): the orders read from the
environment, a DCP save committed with the manifest through the CLI, a resume that steps back to a
fallback when the chosen checkpoint does not load or a shard differs from its manifest, a step saved
again under a name of its own, and what the telemetry lines say."""

from __future__ import annotations

import io
import json
import os

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI", "").lower() != "true" else __import__("torch")

import torch.distributed as dist  # noqa: E402

from supervisor.adapters.checkpoints.posix import PosixBackend  # noqa: E402
from supervisor.adapters.checkpoints.store import BackendCheckpointStore  # noqa: E402
from supervisor.domain.checkpoints.manifest import Guarantee, Level, Outcome  # noqa: E402
from supervisor.domain.checkpoints.resume import CheckpointPick, ResumePlan  # noqa: E402
from supervisor.telemetry.torch import ResumeFailed, ResumeOrders, SkipRanges, Supervision  # noqa: E402


@pytest.fixture
def process_group(tmp_path_factory):
    # a file store: no TCP port to race other processes for (a port found free can be taken before
    # the store binds it: EADDRINUSE on this busy machine)
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(x) for x in stream.getvalue().splitlines()]


def test_skip_ranges_read_megatrons_format():
    skip = SkipRanges.parse("251-380,551-600 700")
    assert 251 in skip and 380 in skip and 700 in skip and 600 in skip
    assert 250 not in skip and 381 not in skip and 701 not in skip
    assert 300 not in SkipRanges.parse("")
    for bad in ("5-", "x-3", "9-3", "-1-4"):
        with pytest.raises(ValueError, match="skip range"):
            SkipRanges.parse(bad)


def test_orders_come_from_the_environment_and_the_resume_file(tmp_path):
    plan = tmp_path / "resume.json"
    # as the daemon writes it (engine/watch/checkpoints.py): the chosen checkpoint and its fallbacks
    chosen, older = (
        CheckpointPick("/ckpt/step_000100", 100, Guarantee.MANIFEST),
        CheckpointPick("/ckpt/step_000050", 50, Guarantee.MANIFEST),
    )
    plan.write_text(json.dumps(ResumePlan(chosen=chosen, fallbacks=(older,)).to_json()))
    env = {
        "SSV_RESUME_CHECKPOINT": "/ckpt/step_000100",
        "SSV_RESUME_STEP": "100",
        "SSV_RESUME_FILE": str(plan),
        "SSV_SKIP_ITERATIONS": "101-400",
        "SSV_LR_SCALE": "0.5",
    }
    orders = ResumeOrders.from_env(env)
    assert orders.candidates == ("/ckpt/step_000100", "/ckpt/step_000050")
    assert orders.step == 100 and 101 in orders.skip and orders.lr_scale == 0.5
    assert ResumeOrders.from_env({"SSV_RESUME_CHECKPOINT": ""}) == ResumeOrders()  # start from scratch
    with pytest.raises(ValueError, match="SSV_LR_SCALE"):
        ResumeOrders.from_env({"SSV_LR_SCALE": "-1"})


def test_save_commits_a_manifest_the_supervisor_verifies_and_resume_falls_back(process_group, tmp_path):
    root = tmp_path / "ckpt"
    out = io.StringIO()
    ssv = Supervision(str(root), run="run42", stream=out, orders=ResumeOrders())
    model = torch.nn.Linear(3, 2)
    for step in (10, 20):
        ssv.save({"model": model.state_dict(), "progress": {"step": step}}, step)
    store = BackendCheckpointStore(PosixBackend(str(root)))
    refs = store.discover()
    assert sorted(ref.step for ref in refs) == [10, 20]
    for ref in refs:
        result = store.verify(ref, Level.FULL)
        assert ref.committed and result.outcome is Outcome.VERIFIED and result.guarantee is Guarantee.MANIFEST, result
    (root / "step_000020" / ".metadata").write_bytes(b"torn")  # the newest will not load

    orders = ResumeOrders(candidates=(str(root / "step_000020"), str(root / "step_000010")), step=20)
    fresh = torch.nn.Linear(3, 2)
    state = {"model": fresh.state_dict(), "progress": {"step": 0}}
    out2 = io.StringIO()
    step = Supervision(str(root), stream=out2, orders=orders).resume(state, step_of=lambda s: s["progress"]["step"])
    assert step == 10 and torch.equal(state["model"]["weight"], model.state_dict()["weight"])
    events = [x["event"] for x in lines(out2)]
    assert events == ["checkpoint_load_start", "checkpoint_load_failed", "checkpoint_load_start", "checkpoint_load_end"]
    assert [x["event"] for x in lines(out)] == ["checkpoint_start", "checkpoint_end"] * 2

    nothing = ResumeOrders(candidates=(str(root / "step_000020"),))
    with pytest.raises(ResumeFailed):
        Supervision(str(root), stream=io.StringIO(), orders=nothing).resume(state)


def test_log_reports_each_ranks_compute_time_not_the_wall_clock(process_group, tmp_path):
    out = io.StringIO()
    ssv = Supervision(str(tmp_path), stream=out, orders=ResumeOrders(), commit=lambda *a: None)
    for step in (1, 2):
        with ssv.compute():
            sum(range(10_000))
        ssv.log(step, loss=2.5, consumed_samples=step * 8)
    record = lines(out)[-1]
    assert record["step"] == 2 and record["loss"] == 2.5 and record["consumed_samples"] == 16
    assert len(record["rank_step_times_s"]) == 1 and record["rank_peer_groups"] == [0]
    assert 0 < record["rank_step_times_s"][0] <= record["step_time_s"]


def python_commit(root: str, name: str, step: int) -> None:
    """The example's committer (examples/torch/train.py): the Python API, no process to start."""
    from supervisor.adapters.checkpoints.commit import build_manifest, commit_checkpoint

    backend = PosixBackend(root)
    commit_checkpoint(backend, name, build_manifest(backend, name, step, writer="test"))


def test_a_step_saved_again_after_resuming_from_an_older_checkpoint_gets_a_name_of_its_own(process_group, tmp_path):
    """A job resumed from step 10 (step 20 passed over as corrupt, or a rollback) reaches step 20
    again: a committed checkpoint is never overwritten, so the second save takes a new name that
    still says its step, and the supervisor finds both."""
    root = tmp_path / "ckpt"
    model = torch.nn.Linear(3, 2)
    first = Supervision(str(root), stream=io.StringIO(), orders=ResumeOrders(), commit=python_commit)
    for step in (10, 20):
        first.save({"model": model.state_dict(), "progress": {"step": step}}, step)
    (root / "step_000030").mkdir()  # a torn upload of step 30: its name is taken too

    again = Supervision(str(root), stream=io.StringIO(), orders=ResumeOrders(), commit=python_commit)
    located = [again.save({"model": model.state_dict(), "progress": {"step": s}}, s) for s in (20, 20, 30)]
    assert [loc.rsplit("/", 1)[-1] for loc in located] == ["step_000020-b", "step_000020-c", "step_000030-b"]
    store = BackendCheckpointStore(PosixBackend(str(root)))
    refs = [ref for ref in store.discover() if ref.committed]
    assert sorted((ref.step, ref.name) for ref in refs) == [
        (10, "step_000010"),
        (20, "step_000020"),
        (20, "step_000020-b"),
        (20, "step_000020-c"),
        (30, "step_000030-b"),
    ]
    for ref in refs:
        assert store.verify(ref, Level.METADATA).outcome is Outcome.VERIFIED, ref


def test_resume_passes_over_a_checkpoint_whose_shard_differs_from_its_manifest(process_group, tmp_path):
    """A shard damaged where the supervisor cannot see it (the same size and modification time: bit
    rot below the storage's API) would load without DCP noticing; resume checks every shard against
    the manifest's checksum first and falls back to the older checkpoint."""
    root = tmp_path / "ckpt"
    model = torch.nn.Linear(3, 2)
    ssv = Supervision(str(root), stream=io.StringIO(), orders=ResumeOrders(), commit=python_commit)
    for step in (10, 20):
        ssv.save({"model": model.state_dict(), "progress": {"step": step}}, step)
    shard = root / "step_000020" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    stat = shard.stat()
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))

    orders = ResumeOrders(candidates=(str(root / "step_000020"), str(root / "step_000010")), step=20)
    state = {"model": torch.nn.Linear(3, 2).state_dict(), "progress": {"step": 0}}
    out = io.StringIO()
    step = Supervision(str(root), stream=out, orders=orders).resume(state, step_of=lambda s: s["progress"]["step"])
    assert step == 10
    failed = [x for x in lines(out) if x["event"] == "checkpoint_load_failed"]
    assert len(failed) == 1 and "__0_0.distcp" in failed[0]["error"] and "checksum" in failed[0]["error"], failed
