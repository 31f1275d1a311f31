"""supervisor.telemetry.torch in one process (world size 1, gloo): the orders read from the
environment, a DCP save committed with the manifest through the CLI, a resume that steps back to a
fallback when the chosen checkpoint does not load, and what the telemetry lines say."""

from __future__ import annotations

import io
import json
import os
import socket

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI", "").lower() != "true" else __import__("torch")

import torch.distributed as dist  # noqa: E402

from supervisor.adapters.checkpoints.posix import PosixBackend  # noqa: E402
from supervisor.adapters.checkpoints.store import BackendCheckpointStore  # noqa: E402
from supervisor.domain.checkpoints import Guarantee, Level, Outcome  # noqa: E402
from supervisor.telemetry.torch import ResumeFailed, ResumeOrders, SkipRanges, Supervision  # noqa: E402


@pytest.fixture
def process_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
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
    plan.write_text(json.dumps({"fallbacks": [{"location": "/ckpt/step_000050", "step": 50}]}))
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
