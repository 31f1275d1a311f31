"""supervisor.telemetry.torch_planned_end with real PyTorch (world size 1, gloo): the continuation
signal is held to the step boundary, where the step is saved (DCP), committed with the manifest and
the loop ends with SSV_CONTINUE_EXIT_CODE; a step saved already is not saved twice; the job's own
clock (SSV_DEADLINE less the lead) ends it too; without orders nothing ends. And a pre-queued job's
Supervision resumes from the checkpoint its resume file names (SSV_RESUME_FROM_FILE=1)."""

from __future__ import annotations

import io
import json
import os
import signal

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI", "").lower() != "true" else __import__("torch")

import torch.distributed as dist  # noqa: E402

from supervisor.adapters.checkpoints.commit import build_manifest, commit_checkpoint  # noqa: E402
from supervisor.adapters.checkpoints.posix import PosixBackend  # noqa: E402
from supervisor.adapters.checkpoints.store import BackendCheckpointStore  # noqa: E402
from supervisor.domain.checkpoints.manifest import Level, Outcome  # noqa: E402
from supervisor.telemetry.orders import ResumeOrders  # noqa: E402
from supervisor.telemetry.planned_end import EndOrders  # noqa: E402
from supervisor.telemetry.torch import Supervision  # noqa: E402
from supervisor.telemetry.torch_planned_end import EndedOnPurpose, EndOnPurpose  # noqa: E402


@pytest.fixture
def process_group(tmp_path_factory):
    store = tmp_path_factory.mktemp("pg") / "store"  # a file store: no TCP port to race for
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def commit(root: str, name: str, step: int) -> None:
    backend = PosixBackend(root)
    commit_checkpoint(backend, name, build_manifest(backend, name, step, writer="test"))


def train(ssv: Supervision, end: EndOnPurpose, model, *, steps: int, signal_in: int | None = None, every: int = 0):
    """A loop as docs/trainer-integration.md has it: the signal arrives in step ``signal_in``'s
    compute, before the update. Returns the last step trained."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = end.state
    step = 0
    while step < steps:
        step += 1
        loss = model(torch.ones(1, 3)).sum()
        loss.backward()
        if step == signal_in:
            os.kill(os.getpid(), signal.SIGUSR1)  # handled between two bytecodes: mid-step
        optimizer.step()
        state["progress"]["step"] = step
        if every and step % every == 0:
            ssv.save(state, step)
        end.boundary(step)
    return step


def setup(tmp_path, orders: EndOrders):
    out = io.StringIO()
    ssv = Supervision(str(tmp_path / "ckpt"), stream=out, orders=ResumeOrders(), commit=commit)
    model = torch.nn.Linear(3, 2)
    state = {"model": model.state_dict(), "progress": {"step": 0}}
    return ssv, model, EndOnPurpose(ssv, state, orders=orders), out


def events(out: io.StringIO) -> list[str]:
    return [json.loads(x)["event"] for x in out.getvalue().splitlines() if '"event"' in x]


def test_the_signal_is_held_to_the_step_boundary_saved_committed_and_ends_with_the_continue_code(
    process_group, tmp_path
):
    ssv, model, end, out = setup(
        tmp_path, EndOrders.from_env({"SSV_CONTINUE_SIGNAL": "USR1", "SSV_CONTINUE_EXIT_CODE": "77"})
    )
    before = signal.getsignal(signal.SIGUSR1)
    with end, pytest.raises(EndedOnPurpose) as ended:
        train(ssv, end, model, steps=50, signal_in=3)
    assert signal.getsignal(signal.SIGUSR1) == before  # handed back
    done = ended.value
    assert (done.step, done.exit_code, done.saved) == (3, 77, True) and "SIGUSR1" in done.why
    store = BackendCheckpointStore(PosixBackend(str(tmp_path / "ckpt")))
    (ref,) = store.discover()
    assert ref.step == 3 and ref.committed and store.verify(ref, Level.FULL).outcome is Outcome.VERIFIED
    assert done.location == str(tmp_path / "ckpt" / "step_000003")
    assert events(out) == ["checkpoint_start", "checkpoint_end"]


def test_a_step_saved_already_is_not_saved_twice(process_group, tmp_path):
    ssv, model, end, out = setup(tmp_path, EndOrders.from_env({"SSV_CONTINUE_SIGNAL": "10"}))
    with end, pytest.raises(EndedOnPurpose) as ended:
        train(ssv, end, model, steps=50, signal_in=4, every=4)
    assert (ended.value.step, ended.value.exit_code, ended.value.saved) == (4, 75, False)
    assert events(out) == ["checkpoint_start", "checkpoint_end"]  # the periodic save only


def test_the_jobs_own_clock_ends_it_lead_s_before_the_deadline(process_group, tmp_path):
    clock = iter(range(1000, 2000))
    orders = EndOrders.from_env({"SSV_DEADLINE": "1610", "SSV_CONTINUE_LEAD_S": "600"})
    ssv, model, _, _ = setup(tmp_path, orders)
    end = EndOnPurpose(
        ssv, {"model": model.state_dict(), "progress": {"step": 0}}, orders=orders, clock=lambda: next(clock)
    )
    with end, pytest.raises(EndedOnPurpose) as ended:
        train(ssv, end, model, steps=50)
    assert ended.value.step == 11 and "deadline" in ended.value.why  # step 11 sees 1010 = 1610 - 600


def test_without_orders_nothing_ends_early(process_group, tmp_path):
    ssv, model, end, out = setup(tmp_path, EndOrders.from_env({}))
    with end:
        assert train(ssv, end, model, steps=5) == 5
    assert events(out) == []


def test_a_prequeued_job_resumes_from_the_checkpoint_its_resume_file_names(process_group, tmp_path, monkeypatch):
    ssv, model, end, _ = setup(tmp_path, EndOrders.from_env({"SSV_CONTINUE_SIGNAL": "USR1"}))
    with end, pytest.raises(EndedOnPurpose):
        train(ssv, end, model, steps=50, signal_in=6)
    plan = {
        "run": "r",
        "checkpoint": {"location": str(tmp_path / "ckpt" / "step_000006"), "step": 6, "guarantee": "manifest"},
    }
    (tmp_path / "resume.json").write_text(json.dumps(plan))
    monkeypatch.setenv("SSV_RESUME_FROM_FILE", "1")
    monkeypatch.setenv("SSV_RESUME_FILE", str(tmp_path / "resume.json"))
    monkeypatch.delenv("SSV_RESUME_CHECKPOINT", raising=False)
    fresh = torch.nn.Linear(3, 2)
    state = {"model": fresh.state_dict(), "progress": {"step": 0}}
    successor = Supervision(str(tmp_path / "ckpt"), stream=io.StringIO(), commit=commit)  # orders from the environment
    assert successor.resume(state, step_of=lambda s: s["progress"]["step"]) == 6
    assert torch.equal(state["model"]["weight"], model.state_dict()["weight"])


def _rank(rank: int, store: str, root: str, results: str) -> None:
    """One of two ranks; only rank 1 is signalled, in step 3."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        ssv = Supervision(root, stream=io.StringIO(), orders=ResumeOrders(), commit=commit)
        model = torch.nn.Linear(3, 2)
        end = EndOnPurpose(
            ssv,
            {"model": model.state_dict(), "progress": {"step": 0}},
            orders=EndOrders.from_env({"SSV_CONTINUE_SIGNAL": "USR1"}),
        )
        with end:
            try:
                train(ssv, end, model, steps=50, signal_in=3 if rank == 1 else None)
            except EndedOnPurpose as done:
                with open(f"{results}.{rank}", "w") as f:
                    json.dump({"step": done.step, "location": done.location, "why": done.why}, f)
    finally:
        dist.destroy_process_group()


def test_a_signal_to_one_rank_ends_every_rank_at_the_same_step(tmp_path):
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    args = (str(tmp_path / "store"), str(tmp_path / "ckpt"), str(tmp_path / "result"))
    ranks = [ctx.Process(target=_rank, args=(r, *args)) for r in (0, 1)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(60)
        assert p.exitcode == 0, p.exitcode
    done = [json.loads((tmp_path / f"result.{r}").read_text()) for r in (0, 1)]
    assert done[0]["step"] == done[1]["step"] == 3 and done[0]["location"] == done[1]["location"]
    assert "another rank" in done[0]["why"] and "SIGUSR1" in done[1]["why"]
    (ref,) = BackendCheckpointStore(PosixBackend(str(tmp_path / "ckpt"))).discover()
    assert ref.step == 3 and ref.committed
