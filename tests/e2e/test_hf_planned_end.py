"""supervisor.telemetry.hf ends a Trainer run on purpose: the continuation signal (held) makes the
Trainer save at the step's end, the callback commits it, and ``train()`` returns the continue code;
a pre-queued job (SSV_RESUME_FROM_FILE=1) resumes from the checkpoint its resume file names. A
one-layer GPT-2 from a config (no hub), a few steps on CPU."""

from __future__ import annotations

import io
import json
import os
import signal

import pytest

pytestmark = pytest.mark.hf
_CI = os.environ.get("CI", "").lower() == "true"  # under CI the hf extra is installed: a missing one fails
torch = pytest.importorskip("torch") if not _CI else __import__("torch")
transformers = pytest.importorskip("transformers") if not _CI else __import__("transformers")

from supervisor.adapters.checkpoints.posix import PosixBackend  # noqa: E402
from supervisor.adapters.checkpoints.store import BackendCheckpointStore  # noqa: E402
from supervisor.domain.checkpoints.manifest import Level, Outcome  # noqa: E402
from supervisor.telemetry.hf import SupervisedTrainer, SupervisorCallback, train  # noqa: E402
from supervisor.telemetry.orders import ResumeOrders  # noqa: E402
from supervisor.telemetry.planned_end import EndOrders  # noqa: E402

SEQ, VOCAB = 16, 64
USR1 = EndOrders(signal=signal.SIGUSR1, exit_code=75)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "error")


class SignalIn(transformers.TrainerCallback):
    """Sends SIGUSR1 to this process while step ``step`` trains."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step:
            os.kill(os.getpid(), signal.SIGUSR1)


class Begins(transformers.TrainerCallback):
    """The step training begins at (after a resume: the checkpoint's)."""

    at: int | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.at = state.global_step


def trainer_for(root, callback, *extra) -> SupervisedTrainer:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=SEQ)
    args = transformers.TrainingArguments(
        output_dir=str(root), max_steps=8, per_device_train_batch_size=4, logging_steps=2, save_steps=4,
        report_to="none", use_cpu=True, disable_tqdm=True, seed=0,
    )  # fmt: skip
    g = torch.Generator().manual_seed(0)
    data = [
        {"input_ids": (ids := torch.randint(0, VOCAB, (SEQ,), generator=g)), "labels": ids.clone()} for _ in range(64)
    ]
    model = transformers.GPT2LMHeadModel(config)
    return SupervisedTrainer(model=model, args=args, train_dataset=data, callbacks=[callback, *extra])


def committed(root) -> list[int]:
    store = BackendCheckpointStore(PosixBackend(str(root)))
    refs = [r for r in store.discover() if r.committed]
    assert all(store.verify(r, Level.FULL).outcome is Outcome.VERIFIED for r in refs)
    return sorted(r.step for r in refs)


def test_the_signal_saves_at_the_steps_end_commits_and_returns_the_continue_code(tmp_path):
    out = io.StringIO()
    callback = SupervisorCallback(orders=ResumeOrders(), end=USR1, stream=out)
    before = signal.getsignal(signal.SIGUSR1)
    trainer = trainer_for(tmp_path, callback, SignalIn(3))
    assert train(trainer, callback) == 75
    assert trainer.state.global_step == 3 and committed(tmp_path) == [3]
    assert signal.getsignal(signal.SIGUSR1) == before
    events = [json.loads(x)["event"] for x in out.getvalue().splitlines() if '"event"' in x]
    assert events == ["checkpoint_start", "checkpoint_end"]


def test_a_prequeued_job_resumes_from_its_resume_file_and_trains_to_the_end(tmp_path, monkeypatch):
    first = SupervisorCallback(orders=ResumeOrders(), end=USR1, stream=io.StringIO())
    assert train(trainer_for(tmp_path, first, SignalIn(5)), first) == 75
    plan = {"checkpoint": {"location": str(tmp_path / "checkpoint-5"), "step": 5, "guarantee": "manifest"}}
    (tmp_path / "resume.json").write_text(json.dumps(plan))
    monkeypatch.setenv("SSV_RESUME_FROM_FILE", "1")
    monkeypatch.setenv("SSV_RESUME_FILE", str(tmp_path / "resume.json"))
    second = SupervisorCallback(end=EndOrders(), stream=io.StringIO())  # the orders from the environment
    begins = Begins()
    trainer = trainer_for(tmp_path, second, begins)
    assert train(trainer, second) == 0 and (begins.at, trainer.state.global_step) == (5, 8)
    assert committed(tmp_path) == [4, 5, 8]
