"""Save on failure: when a peer rank dies, ONE surviving rank saves the state of the last completed
step, without any collective, and the trainer exits (docs/checkpoints.md, *Save on failure*;
just-in-time checkpointing, Gupta et al., EuroSys '24).

    ssv = Supervision(root, run="run42", commit=committer)       # every rank can commit
    with SaveOnFailure(ssv, state, deadline_s=120) as guard:    # deadline: the spec's save_on_failure_s
        while step < total:
            step += 1
            ...forward, backward, all-reduce...
            optimizer.step(); scheduler.step()
            state["progress"]["step"] = step                    # the state's own step counter
            guard.completed(step)                               # no collective since optimizer.step()
            ssv.log(step, ...)
    # a collective that failed because a peer died leaves the block as SavedOnFailure (a
    # RuntimeError; .outcome says which step went where): exit, the run restarts from it.

**Only for replicated state**: plain data parallelism (DDP, or a loop that all-reduces its
gradients), where every rank holds the whole model and optimizer state, so any survivor's copy is
the state. HSDP (a replica is a *group* of ranks, each holding a shard) has ``torch_sharded``: one
survivor per shard writes it. Not for a state without replicas — FSDP / ZeRO-3 alone, tensor or
pipeline parallelism: a dead rank's shard has no copy among the ranks that would write.

**Which step the state belongs to.** The model and optimizer change only inside
``optimizer.step()`` (and the scheduler's step); the collectives of a data-parallel step come before
it (the gradient all-reduce, in DDP during backward) or after it (telemetry, the periodic save). So
a collective that fails before ``optimizer.step()`` of step N leaves the state of step N-1 intact
(the gradients are garbage, but were never applied), and one that fails after it leaves step N's
whole: the state is always that of the last ``completed(step)``, provided no collective runs
between ``optimizer.step()`` and ``completed()``. Survivors may disagree by one step (a ring
all-reduce that some ranks finished before the peer died): each one's state is a consistent,
replicated state of its own completed step; the one that wins the claim writes its own.

**Who writes.** The one survivor that creates the claim file on the checkpoint storage, a
create-if-absent file (``O_EXCL``, S3 ``If-None-Match``) named for this world (Slurm job and step,
torchrun restart, step generation, master address) and keyed by secrets only the job holds (the
run's ``SSV_MANIFEST_KEY``, the launcher's ``SSV_WORLD_NONCE``), so that nobody else who may write
the root can pre-create it. Every survivor tries; the storage decides. The c10d store's ``add``
counter (with a short timeout) is asked first, but only as evidence of who came first: the store
has no authentication, and a stranger who bumps it must not silence the save. The losers write
nothing. The name is the first free one of ``step_NNNNNN``, ``-b``.. as ``Supervision.save`` picks
it; a committed checkpoint is never touched.

**Bounded.** From the failure (or a SIGTERM: srun's ``--kill-on-bad-exit`` or torchrun stopping the
job) a watchdog ``os._exit``\\ s the process after ``deadline_s``; a save cut short has no manifest,
so the supervisor never resumes from it. SIGTERM inside the block is held until the next step
boundary (never mid ``optimizer.step()``), where the state is saved as on a failure.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from supervisor.telemetry.torch import _S3, Supervision

EXIT_DEADLINE = 124  # the watchdog's exit code: the save did not finish in time
CLAIM_KEY = "ssv/save-on-failure"
CLAIM_PREFIX = ".ssv-save-on-failure-"  # a file at the root: no checkpoint's shape, discovery skips it
# What gloo, NCCL and the c10d store say when the other end of a collective is gone (lower case).
PEER_SIGNS = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "read error",
    "write error",
    "socket closed",
    "connection refused",
    "remote process exited",
    "communicator was aborted",
    "timed out",
)


def peer_failure(exc: BaseException) -> str | None:
    """Why ``exc`` says a peer rank is gone, or None: a c10d error (``DistError``: backend, network,
    store), or a RuntimeError with gloo's or NCCL's words for a dead peer (torch 2.13's gloo raises
    a plain RuntimeError, "Read error [...]: Connection reset by peer"). A rank's own errors (a
    shape, an out-of-memory, a GPU fault) are not: that rank's state may be the broken one."""
    text = f"{type(exc).__name__}: {exc}"[:300]
    if isinstance(exc, dist.DistError):
        return text
    if isinstance(exc, RuntimeError) and any(sign in str(exc).lower() for sign in PEER_SIGNS):
        return text
    return None


@dataclass(frozen=True)
class FailureSave:
    """What one rank did about a failure: ``location`` is set on the rank that wrote (or found the
    step already saved by this job); ``why`` says what happened."""

    step: int
    location: str | None
    wrote: bool
    why: str
    seconds: float


class SavedOnFailure(RuntimeError):
    """The training stopped on a peer's failure (or SIGTERM); ``outcome`` says what was saved."""

    def __init__(self, outcome: FailureSave) -> None:
        super().__init__(f"step {outcome.step}: {outcome.why}")
        self.outcome = outcome


class SaveOnFailure:
    """The guard around a training loop (module docstring). ``deadline_s``: how long from the
    failure until the process is ended whatever it does (default ``SSV_SAVE_ON_FAILURE_S``, else
    60); ``claim_timeout_s``: how long the store may take to answer the claim."""

    def __init__(
        self,
        ssv: Supervision,
        state: dict[str, Any],
        *,
        deadline_s: float | None = None,
        claim_timeout_s: float = 5.0,
        store: Any = None,
        handle_sigterm: bool = True,
    ) -> None:
        self.ssv, self.state = ssv, state
        self.deadline_s = deadline_s if deadline_s is not None else float(os.environ.get("SSV_SAVE_ON_FAILURE_S") or 60)
        self.claim_timeout_s = claim_timeout_s
        self.store = store
        self.handle_sigterm = handle_sigterm
        self.step = 0  # the last completed step: 0, nothing trained (nothing worth a save)
        self.terminated = False
        self._previous_handler: Any = None
        self._watchdog: threading.Timer | None = None

    # ------------------------------------------------------------------ the loop's side

    def __enter__(self) -> SaveOnFailure:
        if self.handle_sigterm and threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:  # SIGTERM stays held while the save runs (srun sends it ~1 s after a rank's death)
            why = peer_failure(exc) if exc is not None else None
            if why is not None:  # anything else goes on as it was
                raise SavedOnFailure(self.save_now(f"a peer failed: {why}")) from exc
        finally:
            self._restore_sigterm()

    def completed(self, step: int) -> None:
        """Step ``step``'s update is applied (call right after ``optimizer.step()``, before any
        collective). A SIGTERM held since the last boundary is honoured here: save, then stop."""
        self.step = step
        if self.terminated:
            raise SavedOnFailure(self.save_now("SIGTERM"))  # __exit__ gives SIGTERM back

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        # Held, not raised here: Python runs the handler between any two bytecodes, which may be
        # halfway through optimizer.step(). The watchdog bounds how long it is held.
        self.terminated = True
        self._arm_watchdog()
        print(f"ssv: SIGTERM at step {self.step}: held until the step ends (save on failure)", file=sys.stderr)

    def _restore_sigterm(self) -> None:
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None

    def _arm_watchdog(self) -> None:
        if self._watchdog is None:
            self._watchdog = threading.Timer(self.deadline_s, os._exit, args=(EXIT_DEADLINE,))
            self._watchdog.daemon = True
            self._watchdog.start()

    # ------------------------------------------------------------------ the save

    def save_now(self, reason: str) -> FailureSave:
        """Claim, and if this rank won, save the last completed step (no collective). The watchdog
        is armed first: the process ends ``deadline_s`` from now at the latest."""
        self._arm_watchdog()
        began = time.monotonic()
        step = self.step
        if step <= 0:
            return FailureSave(step, None, False, f"{reason}; no step completed, nothing to save", 0.0)
        saved = self.ssv.last_saved
        if saved is not None and saved[0] == step:
            return FailureSave(step, saved[1], False, f"{reason}; step {step} was saved already", 0.0)
        claimed, how = self._claim(step, reason)
        if not claimed:
            return FailureSave(step, None, False, f"{reason}; {how}", time.monotonic() - began)
        location = self._write(step)
        return FailureSave(step, location, True, f"{reason}; saved step {step} ({how})", time.monotonic() - began)

    def _claim(self, step: int, reason: str) -> tuple[bool, str]:
        """(whether this rank writes, how it was decided). The storage alone decides: every
        survivor creates the claim file, and one creation succeeds. The c10d store's counter is
        evidence only (who came first): the store has no authentication, and a count bumped by a
        stranger must not silence the save (security review 2026-12-02, finding 16)."""
        try:
            store = self.store if self.store is not None else dist.distributed_c10d._get_default_store()
            store.set_timeout(timedelta(seconds=self.claim_timeout_s))
            first = int(store.add(CLAIM_KEY, 1)) == 1
            how = "claimed on the store" if first else "another survivor claimed it on the store"
        except (RuntimeError, ValueError) as exc:  # DistStoreError / DistNetworkError are RuntimeErrors
            first, how = False, f"store unreachable ({type(exc).__name__})"
        evidence = {"rank": self.ssv.rank, "host": socket.gethostname(), "step": step, "reason": reason[:200]}
        won = _claim_file(self.ssv, claim_name(), json.dumps(evidence).encode())
        if won:
            return True, f"{how} and the storage" if first else f"{how}; claimed on the storage"
        return False, f"{how}; another survivor claimed it on the storage" if first else f"{how} and on the storage"

    def _write(self, step: int) -> str:
        """DCP save of this rank's whole state as a one-process checkpoint, then the manifest."""
        ssv = self.ssv
        name = next((n for n in _names(ssv, step) if not ssv._taken(n)), None)
        if name is None:
            raise RuntimeError(f"{ssv.root}: every name for step {step} is taken")
        if ssv.root.startswith("s3://"):
            local = ssv.staging / name
            shutil.rmtree(local, ignore_errors=True)
            dcp.save(self.state, checkpoint_id=str(local), no_dist=True)
            _S3(ssv.root, ssv.endpoint_url).upload(local, name)
            shutil.rmtree(local, ignore_errors=True)
            location = f"{ssv.root}{name}/"
        else:
            location = f"{ssv.root}/{name}"
            dcp.save(self.state, checkpoint_id=location, no_dist=True)
        ssv.commit(ssv.root, name, step)
        return location


def _names(ssv: Supervision, step: int) -> list[str]:
    base = ssv.name(step)
    return [base] + [f"{base}-{letter}" for letter in "bcdefghijklmnopqrstuvwxyz"]


def claim_name(env: dict[str, str] | None = None) -> str:
    """The claim file's name: the same on every rank of this world, another for the next world
    (a relaunched step, a torchrun restart, a new job), and unguessable by anyone who cannot read
    the job's environment: keyed by the run's manifest key the daemon hands the job
    (``SSV_MANIFEST_KEY``) and the world's nonce the in-allocation launcher hands its step
    (``SSV_WORLD_NONCE``). Without either (a job the supervisor did not submit) it is guessable."""
    env = dict(os.environ) if env is None else env
    world = [env.get(k, "") for k in ("SLURM_JOB_ID", "SLURM_STEP_ID", "TORCHELASTIC_RESTART_COUNT")]
    world += [env.get(k, "") for k in ("MASTER_ADDR", "MASTER_PORT", "SSV_STEP_GENERATION")]
    secret = "\0".join(env.get(k, "") for k in ("SSV_MANIFEST_KEY", "SSV_WORLD_NONCE")).encode()
    return CLAIM_PREFIX + hmac.new(secret, "\0".join(world).encode(), hashlib.sha256).hexdigest()[:32]


def _claim_file(ssv: Supervision, name: str, body: bytes) -> bool:
    """Create ``ROOT/name`` unless it exists (one winner, whoever asks at once)."""
    if ssv.root.startswith("s3://"):
        s3 = _S3(ssv.root, ssv.endpoint_url)
        try:
            s3.client.put_object(Bucket=s3.bucket, Key=f"{s3.prefix}{name}", Body=body, IfNoneMatch="*")
        except s3.client.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                return False
            raise
        return True
    Path(ssv.root).mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(Path(ssv.root, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as f:
        f.write(body)
    return True
