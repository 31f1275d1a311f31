"""slurm-supervisor under the Hugging Face Trainer: telemetry, checkpoint commit, resume, skip, LR scale.

    from supervisor.telemetry.hf import SupervisedTrainer, SupervisorCallback, train

    ssv = SupervisorCallback(run="run42")
    trainer = SupervisedTrainer(model=model, args=args, train_dataset=data, callbacks=[ssv])
    sys.exit(train(trainer, ssv))      # 0 trained, 3 no offered checkpoint loads, 75 saved before the
                                       # time limit (SSV_CONTINUE_*); a crash raises (exit 1)

The callback writes the ``ssv`` JSONL lines (docs/telemetry-jsonl.md) at the Trainer's log interval,
``checkpoint_start`` / ``checkpoint_end`` around each save, and commits every ``checkpoint-N`` folder
with the supervisor's manifest (docs/checkpoint-layouts.md). ``train()`` resumes from
``SSV_RESUME_CHECKPOINT`` (or an older verified fallback) and never from an unverified folder;
``SkipIterations`` (a Trainer mixin, in ``SupervisedTrainer``) consumes the batches of
``SSV_SKIP_ITERATIONS`` without training on them; ``SSV_LR_SCALE`` scales the schedule; a pre-queued
job (``SSV_RESUME_FROM_FILE=1``) takes all of them from the resume file. ``SSV_CONTINUE_SIGNAL``
(held) or ``SSV_DEADLINE`` less ``SSV_CONTINUE_LEAD_S`` makes the Trainer save at the step's end and
stop, and ``train()`` return ``SSV_CONTINUE_EXIT_CODE`` (``supervisor.telemetry.planned_end``). The
framework-independent part (the orders, the timer, the telemetry, the commit) is
``supervisor.telemetry.torch.Supervision``; this module only maps the Trainer's events onto it.
Needs ``transformers`` and ``accelerate`` (the ``hf`` extra). docs/recipes.md has the recipe.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.distributed as dist
from transformers import Trainer, TrainerCallback

from supervisor.telemetry.orders import ResumeOrders, SkipRanges
from supervisor.telemetry.planned_end import EndOrders, SignalLatch
from supervisor.telemetry.torch import MANIFEST, Committer, Supervision

EXIT_DONE, EXIT_NO_CHECKPOINT = 0, 3  # the codes of docs/trainer-integration.md (a crash exits 1)
LOAD_FUNCTIONS = frozenset(  # the Trainer's (and TrainerState's) functions that read a checkpoint
    {
        "_load_from_checkpoint",
        "_load_optimizer_and_scheduler",
        "_load_scaler",
        "_load_rng_state",
        "load_from_json",
        "deepspeed_load_checkpoint",
    }
)
LR_MARK = "ssv_lr_scale"  # kept in each optimizer param group, so it travels with the checkpoint


class SupervisorCallback(TrainerCallback):
    """The Trainer's events as the supervisor wants them. Add it to ``callbacks=``; it must come
    after the Trainer's own ``DefaultFlowCallback`` (the default: yours are appended to it)."""

    def __init__(
        self,
        *,
        run: str | None = None,
        commit: Committer | None = None,
        orders: ResumeOrders | None = None,
        peer_groups: Sequence[int] | None = None,
        stream: TextIO | None = None,
        end: EndOrders | None = None,
    ) -> None:
        self.orders = ResumeOrders.from_env() if orders is None else orders
        self.end = EndOrders.from_env() if end is None else end
        self.latch = SignalLatch(self.end.signal)  # installed when training begins
        self.ended_at: int | None = None  # the step the job ended on purpose after (its save)
        self.loading = False  # a checkpoint load announced and not yet finished (see train())
        self._run, self._commit, self._peer_groups, self._stream = run, commit, peer_groups, stream
        self._ssv: Supervision | None = None
        self._saving = self._evaluating = False
        self._since = (time.perf_counter(), 0)  # (when, step) the current step-time interval began

    def supervision(self, output_dir: str) -> Supervision:
        """The shared core, built once the process group exists (the Trainer sets it up)."""
        if self._ssv is None:
            self._ssv = Supervision(
                output_dir,
                run=self._run,
                commit=self._commit,
                orders=self.orders,
                peer_groups=self._peer_groups,
                stream=self._stream,
            )
        return self._ssv

    @property
    def skip(self) -> SkipRanges:
        return self.orders.skip

    # ------------------------------------------------------------------ Trainer events

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.latch.install()
        ssv = self.supervision(args.output_dir)
        if self.loading:  # the Trainer loads model, optimizer and scheduler before this event
            ssv.event("checkpoint_load_end")
            self.loading = False
        apply_lr_scale(kwargs.get("optimizer"), kwargs.get("lr_scheduler"), self.orders.lr_scale)
        self._restart_clock(state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.ended_at is None and _any_rank(self.latch.caught or self.end.due_by_clock(time.time())):
            control.should_save = control.should_training_stop = True  # the Trainer saves this step, then stops
            self.ended_at = state.global_step
        if not control.should_log:  # else after the step's line: a step line ends a pause
            self._announce_pause(args, state, control)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not control.should_log:
            self._announce_pause(args, state, control)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs or "loss" not in logs:  # evaluation metrics, the final summary
            return
        ssv = self.supervision(args.output_dir)
        now, (then, first) = time.perf_counter(), self._since
        step = state.global_step
        global_batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
        skipped = step in self.skip
        ssv.log(
            step,
            loss=trained_loss(logs["loss"], first, step, self.skip),
            grad_norm=None if skipped else logs.get("grad_norm"),  # a skipped step's norm is 0, not a norm
            lr=logs.get("learning_rate"),
            epoch=logs.get("epoch"),
            step_time_s=(now - then) / max(step - first, 1),
            consumed_samples=step * global_batch,
            global_batch_size=global_batch,
        )
        self._since = (now, step)
        self._announce_pause(args, state, control)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.latch.restore()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._evaluating:
            self.supervision(args.output_dir).event("eval_end")
            self._evaluating = False
        self._restart_clock(state.global_step)  # an evaluation's pause is not a step's time
        self._announce_pause(args, state, control)  # the save that follows it, if any

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """After the Trainer wrote ``checkpoint-N`` on every rank: rank 0 commits the manifest."""
        ssv = self.supervision(args.output_dir)
        _barrier()  # every rank's files are written before the manifest names them
        if state.is_world_process_zero:
            _uncommit(args, state)  # a save the pause did not announce (save_strategy "best")
            ssv.commit(args.output_dir, f"checkpoint-{state.global_step}", state.global_step)
        _barrier()
        if self._saving:
            ssv.event("checkpoint_end")
            self._saving = False
        self._restart_clock(state.global_step)

    # ------------------------------------------------------------------ helpers

    def _announce_pause(self, args: Any, state: Any, control: Any) -> None:
        """``eval_start`` / ``checkpoint_start`` for what the Trainer is about to do (it evaluates
        first, then saves: the save is announced when the evaluation ends)."""
        if control.should_evaluate and not self._evaluating:
            self.supervision(args.output_dir).event("eval_start")
            self._evaluating = True
        elif control.should_save and not control.should_evaluate and not self._saving:
            _uncommit(args, state)
            self.supervision(args.output_dir).event("checkpoint_start")
            self._saving = True

    def _restart_clock(self, step: int) -> None:
        self._since = (time.perf_counter(), step)


class SkipIterations:
    """Trainer mixin (``class MyTrainer(SkipIterations, Trainer)``): a step in ``SSV_SKIP_ITERATIONS``
    takes its batches from the data loader and trains on none of them — no forward, no backward,
    so no parameter has a gradient and the optimizer leaves every one of them as it is. The
    forward pass of the steps trained is timed for ``rank_step_times_s`` (it holds no collective).
    The skip ranges come from the ``SupervisorCallback`` among the Trainer's callbacks."""

    state: Any
    args: Any
    callback_handler: Any

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        ssv = supervisor_callback(self)
        if ssv is not None and self.state.global_step + 1 in ssv.skip:
            return torch.zeros((), device=self.args.device)  # adds nothing to the logged loss
        loss: torch.Tensor = super().training_step(model, inputs, num_items_in_batch)  # type: ignore[misc]
        return loss

    def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        ssv = supervisor_callback(self)
        if ssv is None or not model.training:  # evaluation calls it too
            return super().compute_loss(model, inputs, *args, **kwargs)  # type: ignore[misc]
        with ssv.supervision(self.args.output_dir).compute():
            return super().compute_loss(model, inputs, *args, **kwargs)  # type: ignore[misc]


class SupervisedTrainer(SkipIterations, Trainer):
    """``transformers.Trainer`` with ``SkipIterations``."""


def supervisor_callback(trainer: Any) -> SupervisorCallback | None:
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, SupervisorCallback):
            return callback
    return None


def train(trainer: Any, callback: SupervisorCallback) -> int:
    """``trainer.train()`` from the checkpoint the supervisor chose, else each older verified
    fallback in turn (``checkpoint_load_start`` / ``_end`` / ``_failed`` logged for each), else
    from scratch when it offered none. Returns 0 when training ended, 3 when no offered checkpoint
    loaded; any other exception propagates (the process exits 1: restart me)."""
    candidates = callback.orders.candidates
    if not candidates:
        trainer.train()  # never resume_from_checkpoint=True: the newest folder may be torn
        return _ended(callback)
    ssv = callback.supervision(trainer.args.output_dir)
    for location in candidates:
        ssv.event("checkpoint_load_start")
        callback.loading = True
        try:
            trainer.train(resume_from_checkpoint=location)
        except Exception as exc:
            if not callback.loading or not failed_loading(exc):
                raise  # not the checkpoint's failure: a crash, to be restarted
            callback.loading = False
            ssv.event("checkpoint_load_failed", error=f"{location}: {type(exc).__name__}: {exc}"[:400])
            continue
        return _ended(callback)
    return EXIT_NO_CHECKPOINT


def _ended(callback: SupervisorCallback) -> int:
    """0 when training ran to its end; the continue code when it ended on purpose after a save."""
    return EXIT_DONE if callback.ended_at is None else callback.end.exit_code


def failed_loading(exc: BaseException) -> bool:
    """Whether ``exc`` came out of the Trainer's reading of a checkpoint (model, optimizer,
    scheduler, RNG, trainer state) rather than from anything else it does before the first step
    (building the data loader, placing the model): only that is held against the checkpoint."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name in LOAD_FUNCTIONS:
            return True
        tb = tb.tb_next
    return False


# ---------------------------------------------------------------------- pure parts


def trained_loss(mean_loss: Any, first: int, last: int, skip: SkipRanges) -> float | None:
    """The Trainer's logged loss is its sum over steps ``first+1 .. last`` divided by their number,
    skipped steps adding 0: the mean over the steps trained, None when all were skipped."""
    if mean_loss is None or last <= first:
        return None if mean_loss is None else float(mean_loss)
    trained = sum(1 for s in range(first + 1, last + 1) if s not in skip)
    return float(mean_loss) * (last - first) / trained if trained else None


def lr_factor(wanted: float, applied: float | None) -> float:
    """What to multiply an optimizer group's LR by so that ``wanted`` is the scale in force, given
    the scale the checkpoint's group was saved with (None: none, i.e. 1)."""
    return wanted / (applied or 1.0)


def apply_lr_scale(optimizer: Any, scheduler: Any, scale: float) -> None:
    """Scale each param group's LR (and the scheduler's base LR) to ``scale`` x the schedule.

    The scale in force is kept in the group (``LR_MARK``), which the optimizer's state dict saves
    and loads: a checkpoint saved under 0.5 and resumed under 0.5 is not halved again, one resumed
    without a scale goes back to the schedule."""
    if optimizer is None:
        return
    scheduler = getattr(scheduler, "scheduler", scheduler)  # accelerate's wrapper holds the real one
    base_lrs = getattr(scheduler, "base_lrs", None)
    for i, group in enumerate(optimizer.param_groups):
        factor = lr_factor(scale, group.get(LR_MARK))
        group[LR_MARK] = scale
        if factor == 1.0:
            continue
        group["lr"] *= factor
        if "initial_lr" in group:
            group["initial_lr"] *= factor
        if base_lrs is not None and i < len(base_lrs):
            base_lrs[i] *= factor


def _uncommit(args: Any, state: Any) -> None:
    """Rank 0 removes the manifest of an older save under the same name (a run resumed before
    ``checkpoint-N`` saves it again): the folder is rewritten in place, so until the new commit
    it is uncommitted, never taken for verified."""
    if state.is_world_process_zero:
        (Path(args.output_dir) / f"checkpoint-{state.global_step}" / MANIFEST).unlink(missing_ok=True)


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _any_rank(mine: bool) -> bool:
    """Whether any rank says so (every rank saves the same step): one MAX all-reduce."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return mine
    flag = torch.tensor([1 if mine else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())
