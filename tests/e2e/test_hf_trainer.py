"""supervisor.telemetry.hf with a real Hugging Face Trainer: a one-layer GPT-2 built from a config
(no hub), a few steps on CPU. The callback's lines read back through the supervisor's own parser,
its checkpoints verify against their manifests, and a resume from the supervisor's orders falls
back past a checkpoint that does not load, never trains on the skipped steps' batches (nor moves
a weight during them), continues the data where the checkpoint left it and scales the LR."""

from __future__ import annotations

import io
import json
import os
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.hf
_CI = os.environ.get("CI", "").lower() == "true"  # under CI the hf extra is installed: a missing one fails
torch = pytest.importorskip("torch") if not _CI else __import__("torch")
transformers = pytest.importorskip("transformers") if not _CI else __import__("transformers")

from supervisor.adapters.checkpoints.commit import build_manifest, commit_checkpoint  # noqa: E402
from supervisor.adapters.checkpoints.posix import PosixBackend  # noqa: E402
from supervisor.adapters.checkpoints.store import BackendCheckpointStore  # noqa: E402
from supervisor.domain.checkpoints.manifest import Guarantee, Level, Outcome  # noqa: E402
from supervisor.domain.checkpoints.resume import CheckpointPick, ResumePlan  # noqa: E402
from supervisor.domain.progress import parser_for  # noqa: E402
from supervisor.telemetry.hf import (  # noqa: E402
    EXIT_NO_CHECKPOINT,
    LR_MARK,
    SupervisedTrainer,
    SupervisorCallback,
    apply_lr_scale,
    train,
    trained_loss,
)
from supervisor.telemetry.torch import ResumeOrders, SkipRanges  # noqa: E402

SEQ, VOCAB, BATCH = 16, 64, 4


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing may come from the hub
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "error")


class Recording(SupervisedTrainer):
    """Records the first token (= the sample's index) of each batch it trains on, by step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.trained: dict[int, list[int]] = {}

    def compute_loss(self, model, inputs, *args, **kwargs):
        if model.training:
            self.trained[self.state.global_step + 1] = inputs["input_ids"][:, 0].tolist()
        return super().compute_loss(model, inputs, *args, **kwargs)


class Weights(transformers.TrainerCallback):
    """The embedding weights when training begins and after each step."""

    def __init__(self):
        self.at: dict[int, torch.Tensor] = {}

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.at[state.global_step] = model.transformer.wte.weight.detach().clone()

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.at[state.global_step] = model.transformer.wte.weight.detach().clone()


def corpus(n: int = 64) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        ids = torch.randint(0, VOCAB, (SEQ,), generator=g)
        ids[0] = i  # which sample this is
        out.append({"input_ids": ids, "labels": ids.clone()})
    return out


def trainer_for(output_dir, callback: SupervisorCallback, *extra, cls=None) -> Recording:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0, eos_token_id=0
    )
    args = transformers.TrainingArguments(
        output_dir=str(output_dir),
        max_steps=8,
        per_device_train_batch_size=BATCH,
        logging_steps=2,
        save_steps=4,
        learning_rate=1e-3,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    model = transformers.GPT2LMHeadModel(config)
    return (cls or Recording)(model=model, args=args, train_dataset=corpus(), callbacks=[callback, *extra])


def read(out: io.StringIO) -> tuple[list, list[str]]:
    """The progress records the supervisor reads from the lines, and the events in order."""
    parser = parser_for("ssv-jsonl")
    records = [r for line in out.getvalue().splitlines() for r in parser.feed(line)]
    records += parser.flush()
    events = [json.loads(x)["event"] for x in out.getvalue().splitlines() if '"event"' in x]
    return records, events


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """Eight steps from scratch, checkpoints at 4 and 8, committed with the default (the CLI)."""
    root = tmp_path_factory.mktemp("hf")
    out = io.StringIO()
    trainer = trainer_for(root, SupervisorCallback(run="hf", orders=ResumeOrders(), stream=out))
    assert train(trainer, supervisor_of(trainer)) == 0
    return SimpleNamespace(root=root, trainer=trainer, out=out, records=read(out)[0])


def test_the_lines_read_back_and_the_checkpoints_verify(first_run):
    records, events = read(first_run.out)
    assert [r.step for r in records] == [2, 4, 6, 8]
    assert all(r.loss > 0 and r.grad_norm > 0 and r.lr > 0 and r.step_time_s > 0 for r in records)
    assert [len(r.per_rank_step_time_s) for r in records] == [1] * 4 and not any(r.nonfinite for r in records)
    assert [r.consumed_samples for r in records] == [8, 16, 24, 32]
    assert events == ["checkpoint_start", "checkpoint_end"] * 2
    lines = first_run.out.getvalue().splitlines()
    assert lines.index('{"ssv": 1, "event": "checkpoint_start"}') > 1  # after step 4's line: a step ends a pause
    assert_committed(first_run.root, [4, 8])


def test_resume_falls_back_skips_without_training_and_scales_the_lr(first_run):
    root = first_run.root
    plan = root / "resume.json"
    # as the daemon writes it (engine/watch/checkpoints.py): the chosen checkpoint and its fallbacks
    chosen = CheckpointPick(str(root / "checkpoint-6"), 6, Guarantee.MANIFEST)
    older = CheckpointPick(str(root / "checkpoint-4"), 4, Guarantee.MANIFEST)
    plan.write_text(json.dumps(ResumePlan(chosen=chosen, fallbacks=(older,)).to_json()))
    env = {
        "SSV_RESUME_CHECKPOINT": str(root / "checkpoint-6"),  # never saved: does not load
        "SSV_RESUME_FILE": str(plan),
        "SSV_SKIP_ITERATIONS": "5-6",
        "SSV_LR_SCALE": "0.5",
    }
    out, weights = io.StringIO(), Weights()
    callback = SupervisorCallback(orders=ResumeOrders.from_env(env), stream=out, commit=python_commit)
    second = trainer_for(root, callback, weights)
    assert train(second, callback) == 0
    resumed, events = read(out)
    assert events[:4] == [
        "checkpoint_load_start",
        "checkpoint_load_failed",
        "checkpoint_load_start",
        "checkpoint_load_end",
    ]
    first = first_run.trainer
    assert sorted(second.trained) == [7, 8]  # 5 and 6 consumed, not trained
    assert second.trained[7] == first.trained[7] and second.trained[8] == first.trained[8]  # the data continues
    assert torch.equal(weights.at[4], weights.at[6])  # no weight moved during the skip
    assert not torch.equal(weights.at[6], weights.at[8])
    assert [r.step for r in resumed] == [6, 8]
    assert resumed[0].loss is None and resumed[0].grad_norm is None  # nothing was trained: no loss to report
    assert resumed[1].lr == pytest.approx(0.5 * first_run.records[3].lr)
    assert_committed(root, [4, 8])  # checkpoint-8 saved again over the first run's: committed anew


def test_a_failure_that_is_not_the_checkpoints_is_a_crash(first_run):
    """The data loader fails after the model's weights loaded: the checkpoint is not blamed."""

    class NoData(Recording):
        def get_train_dataloader(self):
            raise RuntimeError("the dataset is gone")

    out = io.StringIO()
    callback = SupervisorCallback(orders=ResumeOrders(candidates=(str(first_run.root / "checkpoint-4"),)), stream=out)
    with pytest.raises(RuntimeError, match="dataset is gone"):
        train(trainer_for(first_run.root, callback, cls=NoData), callback)
    assert read(out)[1] == ["checkpoint_load_start"]  # no checkpoint_load_failed


def test_no_offered_checkpoint_loads_exit_3(tmp_path):
    out = io.StringIO()
    orders = ResumeOrders(candidates=(str(tmp_path / "checkpoint-4"), str(tmp_path / "checkpoint-2")))
    trainer = trainer_for(tmp_path, SupervisorCallback(orders=orders, stream=out))
    assert train(trainer, supervisor_of(trainer)) == EXIT_NO_CHECKPOINT
    assert read(out)[1] == ["checkpoint_load_start", "checkpoint_load_failed"] * 2
    assert not trainer.trained


def test_lr_scale_is_kept_with_the_optimizer_and_never_compounds():
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([param], lr=1.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    apply_lr_scale(optimizer, schedule, 0.5)
    saved = (optimizer.state_dict(), schedule.state_dict())
    again = torch.optim.AdamW([param], lr=1.0)
    again_schedule = torch.optim.lr_scheduler.LambdaLR(again, lambda step: 1.0)
    again.load_state_dict(saved[0])
    again_schedule.load_state_dict(saved[1])
    apply_lr_scale(again, again_schedule, 0.5)  # resumed under the same scale: not halved again
    assert again.param_groups[0]["lr"] == 0.5 and again_schedule.base_lrs == [0.5]
    apply_lr_scale(again, again_schedule, 1.0)  # no scale any more: back to the schedule
    again.step()
    again_schedule.step()
    assert again.param_groups[0]["lr"] == 1.0 and again.param_groups[0][LR_MARK] == 1.0


def test_trained_loss_leaves_skipped_steps_out_of_the_mean():
    skip = SkipRanges.parse("5-6")
    assert trained_loss(2.0, 4, 8, skip) == 4.0  # (0 + 0 + l7 + l8) / 4 = 2: l7 + l8 = 8
    assert trained_loss(3.0, 4, 6, skip) is None
    assert trained_loss(3.0, 0, 4, skip) == 3.0
    assert trained_loss(None, 0, 4, skip) is None


def python_commit(root: str, name: str, step: int) -> None:
    """The manifest through the Python API (the first run uses the default, the CLI)."""
    backend = PosixBackend(root)
    commit_checkpoint(backend, name, build_manifest(backend, name, step, writer="test"))


def supervisor_of(trainer) -> SupervisorCallback:
    return next(c for c in trainer.callback_handler.callbacks if isinstance(c, SupervisorCallback))


def assert_committed(root, steps: list[int]) -> None:
    store = BackendCheckpointStore(PosixBackend(str(root)))
    refs = [ref for ref in store.discover() if ref.step in steps]
    assert sorted(ref.step for ref in refs) == steps
    for ref in refs:
        result = store.verify(ref, Level.FULL)
        assert ref.committed and result.outcome is Outcome.VERIFIED and result.guarantee is Guarantee.MANIFEST, result
