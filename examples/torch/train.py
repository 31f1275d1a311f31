"""A tiny GPT trained with data parallelism under torchrun, supervised by slurm-supervisor.

Launched by train.sbatch (one torchrun per node, gloo: CPUs are enough). What it shows, in the
few lines of ``train()``: resuming from the checkpoint the supervisor chose, skipping the
iterations it names, scaling the LR, timing each rank's compute without the collective wait,
telemetry lines, DCP checkpoints committed with the supervisor's manifest, and ending on purpose
before the time limit (the continuation signal or the job's own deadline: save, commit, exit
SSV_CONTINUE_EXIT_CODE). See README.md.

The data is a byte-level corpus (``--data``; generated when the file does not exist). Batch ``s``
(1-based) is samples ``(s-1)*G .. s*G-1`` (``G`` = per-rank batch x world size, rank ``r`` takes
the ``r``-th slice), sample ``i`` is the ``seq_len + 1`` bytes from ``i * (seq_len + 1)``, wrapped
around the end of the corpus: which bytes a step trains on follows from its number alone, so a
restarted job reads exactly the batches the supervisor expects.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import socket
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from supervisor.telemetry.torch import Committer, ResumeFailed, Supervision
from supervisor.telemetry.torch_peers import PeerCopies
from supervisor.telemetry.torch_planned_end import EndedOnPurpose, EndOnPurpose
from supervisor.telemetry.torch_sharded import ShardedSaveOnFailure
from supervisor.telemetry.torch_survivors import SavedOnFailure, SaveOnFailure

EXIT_DONE, EXIT_CRASHED, EXIT_NO_CHECKPOINT, EXIT_BAD_INPUT = 0, 1, 3, 93
VOCAB = 256  # bytes
WORDS = [
    "the",
    "a",
    "one",
    "every",
    "some",
    "model",
    "node",
    "rank",
    "batch",
    "loss",
    "step",
    "data",
    "slurm",
    "job",
    "run",
    "checkpoint",
    "gradient",
    "learns",
    "trains",
    "saves",
    "loads",
    "waits",
    "drains",
    "restarts",
    "resumes",
    "skips",
    "falls",
    "rises",
    "quickly",
    "slowly",
    "again",
    "small",
    "large",
    "tiny",
    "healthy",
    "broken",
    "verified",
    "torn",
    "fast",
    "slow",
    "and",
    "but",
    "then",
    "while",
    "because",
]


class BadInput(ValueError):
    """Input that a restart will not fix (an empty corpus)."""


class TinyGPT(nn.Module):
    """Token and position embeddings, causal transformer blocks, a linear head."""

    def __init__(self, seq_len: int, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, dim)
        self.positions = nn.Parameter(torch.zeros(seq_len, dim))
        block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tokens(x) + self.positions[: x.shape[1]]
        return self.head(self.norm(self.blocks(h, mask=self.mask, is_causal=True)))


def make_text(n_bytes: int, seed: int = 0) -> bytes:
    """Sentences from a small vocabulary: learnable in a few dozen steps, never exhausted."""
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < n_bytes:
        sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))).capitalize() + ". "
        out.append(sentence)
        size += len(sentence)
    return "".join(out).encode()[:n_bytes]


def batch(corpus: torch.Tensor, step: int, per_rank: int, seq_len: int, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s slice of batch ``step`` (module docstring): ``per_rank`` rows of seq_len+1."""
    first = (step - 1) * per_rank * world + rank * per_rank
    width = seq_len + 1
    starts = (torch.arange(first, first + per_rank) * width) % corpus.numel()
    index = (starts[:, None] + torch.arange(width)[None, :]) % corpus.numel()
    return corpus[index].long()


def average_gradients(model: nn.Module, loss: torch.Tensor, world: int) -> float:
    """All-reduce the gradients (and the loss, in the same call) to their mean; the mean loss."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads] + [loss.detach().reshape(1)])
    if world > 1:
        dist.all_reduce(flat)
        flat /= world
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
    return float(flat[-1])


def mean(loss: torch.Tensor, world: int) -> float:
    flat = loss.detach().reshape(1).clone()
    dist.all_reduce(flat)
    return float(flat[0]) / world


def full(value: torch.Tensor) -> float:
    """A norm as a number (a DTensor's, once gathered: FSDP's clip returns one)."""
    return float(value.full_tensor() if hasattr(value, "full_tensor") else value)


def python_committer(run: str | None, endpoint_url: str | None) -> Committer:
    """Commit with the supervisor's Python API (docs/checkpoint-layouts.md): no process to start,
    unlike the default ``slurm-supervisor ckpt commit`` (``--commit cli``)."""
    from supervisor.adapters.checkpoints.commit import build_manifest, commit_checkpoint
    from supervisor.adapters.checkpoints.posix import PosixBackend
    from supervisor.adapters.checkpoints.s3 import S3Backend

    def commit(root: str, name: str, step: int) -> None:
        s3 = root.startswith("s3://")
        backend = S3Backend(root, endpoint_url=endpoint_url) if s3 else PosixBackend(root)
        manifest = build_manifest(backend, name, step, writer=socket.gethostname(), run=run)
        commit_checkpoint(backend, name, manifest)

    return commit


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", required=True, help="checkpoint root: a directory or s3://bucket/prefix/")
    p.add_argument("--run", default=os.environ.get("SLURM_JOB_NAME"), help="run name written in manifests")
    p.add_argument("--data", type=Path, required=True, help="byte corpus (generated when missing)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--ckpt-every", type=int, default=20)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-step-s", type=float, default=0.0, help="pace: sleep so a step lasts this long")
    p.add_argument(
        "--compute-s", type=float, default=0.0, help="sleep this long in each step's compute (a GPU's share)"
    )
    p.add_argument(
        "--straggler-file",
        type=Path,
        help="when it exists, it names a node and a fraction ('n2 0.1'): that node's compute sleeps that much longer",
    )
    p.add_argument(
        "--save-on-failure",
        action="store_true",
        help="when a peer rank dies, one survivor saves the last completed step (SSV_SAVE_ON_FAILURE_S bounds it)",
    )
    p.add_argument(
        "--die-file",
        type=Path,
        help="once it holds 'NODE STEP' (or 'NODE STEP after-update'), that node's rank exits in that step (tests)",
    )
    p.add_argument(
        "--stall-file",
        type=Path,
        help="once it holds 'NODE STEP loader' (or 'NODE STEP recv'), that node's rank hangs in that step: in its "
        "data loader (a sleep), or in a receive no peer sends to while the others wait in the all-reduce (tests)",
    )
    p.add_argument(
        "--layout",
        choices=("dp", "hsdp", "fsdp"),
        default="dp",
        help="dp: every rank holds the whole state (gradients all-reduced); hsdp: FSDP2 sharded over "
        "each node's ranks, replicated across nodes (a 2-D device mesh); fsdp: sharded over every rank",
    )
    p.add_argument(
        "--peer-copies",
        type=int,
        default=0,
        metavar="K",
        help="every K steps each rank's shards are copied to its buddy on the next node (host memory); "
        "a relaunched world restores from them when they are newer than the offered checkpoint",
    )
    p.add_argument("--trace", type=Path, help="rank 0 appends one JSON line per step (trained or skipped)")
    p.add_argument(
        "--exit-file", type=Path, default=os.environ.get("TRAIN_EXIT_FILE"), help="rank 0 writes its exit code"
    )
    p.add_argument("--commit", choices=("python", "cli"), default="python", help="how rank 0 commits the manifest")
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args(argv)
    if args.save_on_failure and args.layout == "fsdp":
        p.error("--save-on-failure needs a replica of every shard (dp or hsdp); fsdp has --peer-copies")
    if min(args.steps, args.ckpt_every, args.batch, args.seq_len, args.dim, args.layers) < 1 or args.lr <= 0:
        p.error("sizes, steps and the learning rate must be positive")
    return args


def load_corpus(path: Path) -> torch.Tensor:
    if not path.exists():  # every rank may get here at once: each writes its own file, then renames it
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        partial.write_bytes(make_text(1 << 20))
        os.replace(partial, path)
    data = path.read_bytes()
    if len(data) < 2:
        raise BadInput(f"{path}: the corpus is empty")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


@dataclass
class Job:
    """What one rank trains with."""

    args: argparse.Namespace
    ssv: Supervision
    model: nn.Module
    optimizer: torch.optim.Optimizer
    corpus: torch.Tensor
    state: dict[str, Any]
    trace: Trace
    mesh: Any = None  # the device mesh of a sharded layout (None: dp)
    guard: SaveOnFailure | None = None
    peers: PeerCopies | None = None

    def completed(self, step: int) -> None:
        """Step ``step``'s update is in the state (right after optimizer.step(), no collective
        between): the step the state holds, and for save-on-failure the step it would save."""
        self.state["progress"]["step"] = step
        if self.guard is not None:
            self.guard.completed(step)  # a SIGTERM held since the last step is honoured here


def train(args: argparse.Namespace) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = TinyGPT(args.seq_len, args.dim, args.layers, heads=2)
    mesh = shard(model, args.layout)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    # every rank gets the committer: after a failure, the survivor that saves may be any rank
    commit = python_committer(args.run, endpoint) if args.commit == "python" else None
    ssv = Supervision(args.root, run=args.run, endpoint_url=endpoint, commit=commit)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "progress": {"step": 0}}
    job = Job(args, ssv, model, optimizer, load_corpus(args.data), state, Trace(args.trace if rank == 0 else None))
    job.mesh = mesh
    job.peers = PeerCopies(state, every=args.peer_copies) if args.peer_copies else None
    step = restore(job)
    if step:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    job.guard = failure_guard(job) if args.save_on_failure else None
    # a peer's death: one survivor saves `step`, then out; the continuation signal: every rank saves
    with job.guard or contextlib.nullcontext(), EndOnPurpose(ssv, state) as end:
        while step < args.steps:
            step += 1
            if ssv.skip(step):  # SSV_SKIP_ITERATIONS: the batch is consumed, never trained on
                job.completed(step)
                job.trace.write(step=step, skipped=True, consumed_samples=step * world * args.batch)
                continue
            train_step(job, step)
            if job.peers is not None:
                job.peers.boundary(step)  # every K steps: snapshot, then the buddy's copy on a thread
            if step % args.ckpt_every == 0:
                ssv.save(state, step)
            end.boundary(step)  # SSV_CONTINUE_SIGNAL caught, or SSV_DEADLINE near: save, EndedOnPurpose
    if job.peers is not None:  # trained to the end: the copies in memory are not needed any more
        job.peers.close(discard=True)
        taken = list(job.peers.snapshots) or [0.0]
        say(  # the first pays torch.save's warm-up: the median is what each later one costs
            f"peer copies: snapshots {statistics.median(taken) * 1e3:.2f} ms each (median; first "
            f"{taken[0] * 1e3:.2f} ms), {job.peers.skipped} skipped"
        )


def restore(job: Job) -> int:
    """The step resumed from: the peers' memory when it holds a generation newer than the
    checkpoint the supervisor offered (and the supervisor did not say "not from memory": a
    rollback), else that checkpoint (0: a fresh start). Says how long."""
    began = time.perf_counter()
    if job.peers is not None and job.ssv.orders.memory_step != 0:  # 0: the supervisor says not from memory
        done = job.peers.restore(job.state, newer_than=job.ssv.orders.step or 0)
        if done.step:
            say(f"restored step {done.step} from memory in {done.seconds:.3f} s ({done.moved_bytes} bytes moved)")
            return done.step
        say(f"peer copies: {done.why}")
    step = job.ssv.resume(job.state, step_of=lambda s: int(s["progress"]["step"]))
    if step:
        say(f"restored step {step} from storage in {time.perf_counter() - began:.3f} s")
    return step


def say(text: str) -> None:
    if dist.get_rank() == 0:
        print(f"train.py: {text}", file=sys.stderr, flush=True)


def shard(model: nn.Module, layout: str) -> Any:
    """HSDP: each block, then the whole, ``fully_shard`` over a (nodes, ranks per node) mesh —
    sharded over a node's ranks, replicated across nodes; FSDP: over every rank, no replica. The
    mesh (None for dp)."""
    if layout == "dp":
        return None
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    world = dist.get_world_size()
    shape, names = (
        ((world // per_node, per_node), ("replicate", "shard")) if layout == "hsdp" else ((world,), ("shard",))
    )
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    for block in model.blocks.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return mesh


def failure_guard(job: Job) -> SaveOnFailure:
    """Who saves when a peer dies: one survivor (dp: each holds the whole state), or one per shard
    (hsdp: the replica groups that survived hold every shard)."""
    if job.mesh is None:
        return SaveOnFailure(job.ssv, job.state)
    shards = job.mesh.size(job.mesh.mesh_dim_names.index("shard"))
    return ShardedSaveOnFailure(job.ssv, job.state, shard=job.mesh.get_local_rank("shard"), shards=shards)


def train_step(job: Job, step: int) -> None:
    """One step: forward and backward, the gradients' all-reduce, the update, telemetry. The state
    changes only in optimizer.step(): a collective that fails before it leaves step-1's state,
    one after it (telemetry, the save) step's."""
    args, ssv, optimizer = job.args, job.ssv, job.optimizer
    rank, world = dist.get_rank(), dist.get_world_size()
    began = time.perf_counter()
    for group in optimizer.param_groups:
        group["lr"] = args.lr * min(1.0, step / 10) * ssv.lr_scale  # warm-up, then flat
    optimizer.zero_grad(set_to_none=True)
    tokens = load_batch(job, step)
    with ssv.compute():  # forward + backward only: no collective inside
        logits = job.model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()
        time.sleep(args.compute_s * (1.0 + straggling(args.straggler_file)))
        die_if_told(args.die_file, step, after_update=False)
    if stall_told(args.stall_file, step, "recv"):  # a mismatched collective: everyone waits in one
        dist.recv(torch.zeros(1), src=(rank + 1) % world)
    # dp: the gradients and the loss in one all-reduce; hsdp: FSDP reduced the gradients in backward
    mean_loss = average_gradients(job.model, loss, world) if job.mesh is None else mean(loss, world)
    grad_norm = full(nn.utils.clip_grad_norm_(job.model.parameters(), 1.0))
    optimizer.step()
    job.completed(step)
    die_if_told(args.die_file, step, after_update=True)
    pause = args.min_step_s - (time.perf_counter() - began)
    if pause > 0:
        time.sleep(pause)
    consumed = step * world * args.batch
    ssv.log(step, loss=mean_loss, grad_norm=grad_norm, lr=optimizer.param_groups[0]["lr"],
            consumed_samples=consumed, global_batch_size=world * args.batch)  # fmt: skip
    job.trace.write(step=step, batch=step, loss=mean_loss, consumed_samples=consumed)


def load_batch(job: Job, step: int) -> torch.Tensor:
    """The step's tokens: this example's data loader (it stalls here when the test's file says so)."""
    args = job.args
    if stall_told(args.stall_file, step, "loader"):
        time.sleep(3600)  # a data loader stuck on its storage
    return batch(job.corpus, step, args.batch, args.seq_len, dist.get_rank(), dist.get_world_size())


def stall_told(path: Path | None, step: int, kind: str) -> bool:
    """Whether the test's file names this node, ``step`` and ``kind``; the file is moved aside
    first, so that the restarted job does not stall again."""
    if path is None:
        return False
    try:
        node, at, what = path.read_text().split()
        told = node == os.environ.get("SLURMD_NODENAME") and int(at) == step and what == kind
    except (OSError, ValueError):  # not written (yet), or not "NODE STEP KIND"
        return False
    if told:
        path.rename(path.with_name(path.name + ".done"))
        print(f"train.py: stalling ({kind}) in step {step} as {path} says", file=sys.stderr, flush=True)
    return told


def die_if_told(path: Path | None, step: int, *, after_update: bool) -> None:
    """Exit at once, as a GPU fault's crash does (no exception, no cleanup), when the test's file
    names this node and ``step`` (and ``after-update`` when after the optimizer's step). The file
    is moved aside first: the restarted job does not die again."""
    if path is None:
        return
    try:
        node, at, *when = path.read_text().split()
        told = node == os.environ.get("SLURMD_NODENAME") and int(at) == step
    except (OSError, ValueError):  # not written (yet), or not "NODE STEP"
        return
    if told and (when == ["after-update"]) == after_update:
        path.rename(path.with_name(path.name + ".done"))
        print(f"train.py: dying in step {step} as {path} says", file=sys.stderr, flush=True)
        os._exit(EXIT_CRASHED)


def straggling(path: Path | None) -> float:
    """How much slower this node's compute is made (0: not at all), as the test's file says: a
    straggler made by the test, as a GPU with falling clocks is (a sleep: the rest is as fast)."""
    if path is None:
        return 0.0
    try:
        node, fraction = path.read_text().split()
        return max(0.0, min(float(fraction), 10.0)) if node == os.environ.get("SLURMD_NODENAME") else 0.0
    except (OSError, ValueError):  # not written (yet), or not "NODE FRACTION"
        return 0.0


class Trace:
    """Rank 0's record of what each step did, for tests and post-mortems."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        env = os.environ
        self.fields = {
            "job": env.get("SLURM_JOB_ID"),
            "attempt": env.get("SLURM_SUPERVISOR_ATTEMPT"),
            "generation": env.get("SSV_STEP_GENERATION"),  # in-allocation mode: the step's relaunch
        }

    def write(self, **entry: object) -> None:
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps({**self.fields, "time": round(time.time(), 3), **entry}) + "\n")


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(argv)
    except SystemExit as exc:  # argparse: bad arguments will not get better by restarting
        code = EXIT_BAD_INPUT if exc.code else EXIT_DONE
        exit_file = os.environ.get("TRAIN_EXIT_FILE")
        if exit_file and os.environ.get("RANK", "0") == "0":
            Path(exit_file).write_text(f"{code}\n")
        return code
    dist.init_process_group("gloo")
    code = EXIT_CRASHED  # what rank 0 leaves in the exit file if an exception escapes
    ended = False  # ended on purpose: every rank saved, the process group is whole
    try:
        train(args)
        code = EXIT_DONE
    except EndedOnPurpose as exc:  # saved and committed before the time limit: continue me
        print(f"train.py: ended on purpose at step {exc.step}: {exc.why}", file=sys.stderr, flush=True)
        code, ended = exc.exit_code, True
    except SavedOnFailure as exc:  # a peer died; this rank saved (or left it to another): restartable
        done = exc.outcome
        print(f"train.py: stopped: {done.why}: {done.location} ({done.seconds:.3f} s)", file=sys.stderr, flush=True)
        code = EXIT_CRASHED
    except ResumeFailed as exc:
        print(f"train.py: no offered checkpoint could be loaded: {exc}", file=sys.stderr)
        code = EXIT_NO_CHECKPOINT
    except BadInput as exc:
        print(f"train.py: {exc}", file=sys.stderr)
        code = EXIT_BAD_INPUT
    finally:
        if dist.get_rank() == 0 and args.exit_file:
            args.exit_file.write_text(f"{code}\n")
        if code == EXIT_DONE or ended:
            dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
