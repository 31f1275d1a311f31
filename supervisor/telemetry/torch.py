"""slurm-supervisor in a PyTorch training loop: resume, skip, LR scale, timing, telemetry, commit.

    from supervisor.telemetry.torch import Supervision

    ssv = Supervision(root="s3://bucket/run42/ckpt/", run="run42")   # after init_process_group
    state = {"model": ..., "optim": ..., "progress": {"step": 0}}
    step = ssv.resume(state)                         # 0: fresh start (no verified checkpoint)
    while step < total:
        step += 1
        if ssv.skip(step):                           # SSV_SKIP_ITERATIONS: the batch is consumed, not trained
            continue
        with ssv.compute():                          # forward + backward: the time without the collectives
            loss = model(batch(step)).backward()
        all_reduce_gradients(); optimizer.step()     # lr * ssv.lr_scale (SSV_LR_SCALE)
        ssv.log(step, loss=loss, grad_norm=gn)       # every rank: gathers per-rank times, rank 0 prints
        if step % every == 0:
            ssv.save(state, step)                    # DCP save, barrier, manifest commit (rank 0)

Telemetry: the ``ssv`` JSONL protocol (docs/telemetry-jsonl.md); checkpoints: the manifest
contract (docs/checkpoint-layouts.md); save on failure: ``torch_survivors``. Needs ``torch`` and,
for ``s3://``, ``boto3``; imports nothing else of slurm-supervisor: the manifest is committed by
``slurm-supervisor ckpt commit`` (or any ``commit`` callable), so no daemon code loads here.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: caught by name

from supervisor.telemetry.jsonl import report
from supervisor.telemetry.orders import ResumeOrders
from supervisor.telemetry.orders import SkipRanges as SkipRanges  # part of this module's API
from supervisor.telemetry.shard_check import check_shards

Committer = Callable[[str, str, int], None]  # (root, checkpoint name, step)
MANIFEST = "ssv-manifest.json"


class ResumeFailed(RuntimeError):
    """No checkpoint the supervisor offered could be loaded (each failure was reported)."""


class ComputeTimer:
    """Seconds spent inside ``with timer:`` blocks since the last ``take()``, and the steps they
    covered: a rank's own pace, without the time it waits for slower ranks at a collective."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.steps = 0
        self._began = 0.0

    def __enter__(self) -> ComputeTimer:
        self._began = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds += time.perf_counter() - self._began
        self.steps += 1

    def take(self) -> float:
        """Mean seconds per step since the last call (NaN when no step was timed); resets."""
        mean = self.seconds / self.steps if self.steps else math.nan
        self.seconds, self.steps = 0.0, 0
        return mean


def cli_committer(*, run: str | None = None, endpoint_url: str | None = None, timeout_s: float = 600.0) -> Committer:
    """A committer that runs ``slurm-supervisor ckpt commit`` (the installed command, else
    ``python -m supervisor``). ``RuntimeError`` with the command's words when it fails."""
    exe = shutil.which("slurm-supervisor")
    base = [exe] if exe else [sys.executable, "-m", "supervisor"]

    def commit(root: str, name: str, step: int) -> None:
        argv = [*base, "ckpt", "commit", root, name, "--step", str(step), "--writer", socket.gethostname()]
        argv += ["--run", run] if run else []
        argv += ["--endpoint-url", endpoint_url] if endpoint_url else []
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"ckpt commit {name} exited {done.returncode}: {done.stderr.strip() or done.stdout}")

    return commit


class Supervision:
    """One training job's side of the supervisor's contract. Create it after
    ``torch.distributed.init_process_group`` and call every method on every rank (they hold
    collectives), except where said."""

    def __init__(
        self,
        root: str,
        *,
        run: str | None = None,
        endpoint_url: str | None = None,
        commit: Committer | None = None,
        orders: ResumeOrders | None = None,
        peer_groups: Sequence[int] | None = None,
        staging: str | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self.root = root.rstrip("/") if not root.startswith("s3://") else root.rstrip("/") + "/"
        self.endpoint_url = endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None
        self.orders = ResumeOrders.from_env() if orders is None else orders
        self.commit = commit or cli_committer(run=run, endpoint_url=self.endpoint_url)
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.peer_groups = list(peer_groups) if peer_groups is not None else [0] * self.world
        self.staging = Path(staging or tempfile.gettempdir()) / f"ssv-stage-{os.getpid()}-rank{self.rank}"
        self.stream = stream
        self.timer = ComputeTimer()
        self._last_log = (time.perf_counter(), 0)  # (when, step) of the previous report
        self.last_saved: tuple[int, str] | None = None  # (step, location) of this job's last save

    # ------------------------------------------------------------------ orders

    @property
    def lr_scale(self) -> float:
        return self.orders.lr_scale

    def skip(self, step: int) -> bool:
        """Whether ``step`` is in a skip range: consume its batch, do not train on it."""
        return step in self.orders.skip

    def compute(self) -> ComputeTimer:
        """``with ssv.compute():`` around the forward and backward passes (no collective inside)."""
        return self.timer

    # ------------------------------------------------------------------ telemetry

    def event(self, name: str, **extra: str) -> None:
        """A pause or load event line (rank 0): ``checkpoint_start``, ``checkpoint_load_failed``..."""
        if self.rank == 0:
            out = self.stream or sys.stdout
            out.write(json.dumps({"ssv": 1, "event": name, **extra}) + "\n")
            out.flush()

    def log(self, step: int, **metrics: Any) -> None:
        """Gather each rank's compute time per step since the last call (one small all-gather) and,
        on rank 0, print the progress line for ``step`` with ``metrics`` (``report()``'s fields)."""
        mine = torch.tensor([self.timer.take()], dtype=torch.float64)
        if self.world > 1:
            every = [torch.empty_like(mine) for _ in range(self.world)]
            dist.all_gather(every, mine)
        else:
            every = [mine]
        now = time.perf_counter()
        then, last_step = self._last_log
        self._last_log = (now, step)
        if self.rank != 0:
            return
        steps = max(step - last_step, 1)
        metrics.setdefault("step_time_s", (now - then) / steps)
        report(
            step,
            stream=self.stream,
            rank_step_times_s=[t.item() for t in every],
            rank_peer_groups=self.peer_groups,
            **metrics,
        )

    # ------------------------------------------------------------------ checkpoints

    def name(self, step: int) -> str:
        return f"step_{step:06d}"

    def save(self, state: dict[str, Any], step: int) -> str:
        """Save ``state`` with torch.distributed.checkpoint as ``ROOT/step_NNNNNN``, then rank 0
        commits the manifest once every rank's shards are on storage. Returns the location.

        A job resumed from an older checkpoint (a newer one passed over as corrupt, a rollback)
        reaches the same steps again; a committed checkpoint is never overwritten and a torn one is
        not mixed with new shards, so when something is stored under the name already the save
        takes the next free one of ``step_NNNNNN-b`` .. ``-z`` (the step is still the last number in
        the name, which is how the supervisor reads it)."""
        name = self._free_name(step)
        self.event("checkpoint_start")
        if self.root.startswith("s3://"):
            local = self.staging / name
            shutil.rmtree(local, ignore_errors=True)
            dcp.save(state, checkpoint_id=str(local))  # each rank stages only what it writes
            _S3(self.root, self.endpoint_url).upload(local, name)
            shutil.rmtree(local, ignore_errors=True)
            location = f"{self.root}{name}/"
        else:
            location = f"{self.root}/{name}"
            dcp.save(state, checkpoint_id=location)
        _barrier()  # every shard is written before the manifest names them
        if self.rank == 0:
            self.commit(self.root, name, step)
        _barrier()  # nobody deletes or resumes before the commit
        self.event("checkpoint_end")
        self._last_log = (time.perf_counter(), step)  # the save's pause is not a step's time
        self.last_saved = (step, location)
        return location

    def _free_name(self, step: int) -> str:
        """The first of ``name(step)``, ``-b`` .. ``-z`` with nothing stored under it: rank 0 looks,
        every rank gets its answer (they must write to the same place)."""
        chosen: list[str | None] = [None]
        if self.rank == 0:
            base = self.name(step)
            names = [base] + [f"{base}-{letter}" for letter in "bcdefghijklmnopqrstuvwxyz"]
            chosen = [next((n for n in names if not self._taken(n)), None)]
        if self.world > 1:
            dist.broadcast_object_list(chosen, src=0)
        if chosen[0] is None:
            raise RuntimeError(f"{self.root}: every name for step {step} is taken ({self.name(step)} to -z)")
        return chosen[0]

    def _taken(self, name: str) -> bool:
        if self.root.startswith("s3://"):
            return _S3(self.root, self.endpoint_url).holds(name)
        return Path(self.root, name).exists()

    def resume(self, state: dict[str, Any], *, step_of: Callable[[dict[str, Any]], int] | None = None) -> int:
        """Load the checkpoint the supervisor chose into ``state`` (in place), else its older
        verified fallbacks in turn. Returns the step resumed from (``step_of(state)``, default the
        supervisor's ``SSV_RESUME_STEP``), 0 when there is nothing to resume. ``ResumeFailed`` when
        no candidate loads: ``checkpoint_load_failed`` is then in the log for the supervisor."""
        if not self.orders.candidates:
            return 0
        errors = []
        for location in self.orders.candidates:
            self.event("checkpoint_load_start")
            try:
                self._load(state, location)
            except (Exception, CheckpointException) as exc:  # noqa: BLE001 - report it, try the next one
                self.event("checkpoint_load_failed", error=f"{location}: {type(exc).__name__}: {exc}"[:400])
                errors.append(f"{location}: {exc}")
                _barrier()
                continue
            self.event("checkpoint_load_end")
            step = step_of(state) if step_of is not None else (self.orders.step or 0)
            self._last_log = (time.perf_counter(), step)
            return step
        raise ResumeFailed("; ".join(errors))

    def _load(self, state: dict[str, Any], location: str) -> None:
        """Fetch (S3: into the staging folder), check the shards against the manifest (each rank
        its share: ``check_shards``), and only when every rank could, ``dcp.load``."""
        s3 = location.startswith("s3://")
        local = self.staging / "resume" if s3 else Path(location)
        try:
            try:
                if s3:
                    shutil.rmtree(local, ignore_errors=True)
                    _S3(location, self.endpoint_url).download(local)
                check_shards(local, rank=self.rank, world=self.world)
            except Exception:
                _all_agree(ok=False)  # the others must not wait in dcp.load for this rank
                raise
            if not _all_agree(ok=True):
                raise ResumeFailed(f"{location}: another rank could not fetch it or found a shard damaged")
            dcp.load(state, checkpoint_id=str(local))
        finally:
            if s3:
                shutil.rmtree(local, ignore_errors=True)


def _all_agree(*, ok: bool) -> bool:
    """Whether every rank says ``ok`` (one all-reduce; True without a process group)."""
    if not dist.is_initialized():
        return ok
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


class _S3:
    """The few S3 calls a staged DCP checkpoint needs (boto3's credential chain; a CRC64NVME kept
    with every upload, so the manifest is built without reading the shards back)."""

    def __init__(self, url: str, endpoint_url: str | None) -> None:
        import boto3

        bucket, _, prefix = url[len("s3://") :].partition("/")
        self.bucket, self.prefix = bucket, prefix.rstrip("/") + "/" if prefix else ""
        self.client = boto3.client("s3", endpoint_url=endpoint_url)

    def upload(self, local: Path, name: str) -> None:
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            key = f"{self.prefix}{name}/{path.relative_to(local).as_posix()}"
            with path.open("rb") as body:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=body, ChecksumAlgorithm="CRC64NVME")

    def holds(self, name: str) -> bool:
        """Whether any object is stored under ``name/``."""
        found = self.client.list_objects_v2(Bucket=self.bucket, Prefix=f"{self.prefix}{name}/", MaxKeys=1)
        return bool(found.get("KeyCount") or found.get("Contents"))

    def download(self, local: Path) -> None:
        """Every object under the checkpoint's prefix, the manifest too (any rank may read any shard)."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
        found = False
        for page in pages:
            for obj in page.get("Contents", []):
                relative = obj["Key"][len(self.prefix) :]
                if not relative or ".." in relative.split("/"):
                    continue
                target = local / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                self.client.download_file(self.bucket, obj["Key"], str(target))
                found = True
        if not found:
            raise FileNotFoundError(f"s3://{self.bucket}/{self.prefix}: no checkpoint objects")


@contextlib.contextmanager
def supervised_process_group(backend: str = "gloo") -> Iterator[None]:
    """``init_process_group`` from torchrun's environment for the ``with`` block, destroyed after."""
    dist.init_process_group(backend)
    try:
        yield
    finally:
        dist.destroy_process_group()
