"""The end-to-end scenarios of examples/torch under the real daemon, shared by tests/e2e (which
assert on what happened) and bench/e2e.py (which times it).

* ``crash``: a two-node run with DCP checkpoints in S3 (the harness's Ceph RGW); the batch host is
  crashed mid-training. With ``corrupt=True`` the newest checkpoint's shard is first overwritten
  in the bucket (same size, other bytes) and the crash waits for the supervisor to find it corrupt.
* ``spike``: poisoned batches planted in the corpus make a loss spike that does not heal; the
  supervisor rolls back to a verified checkpoint before it, skipping the batches.

Steps are paced (``--min-step-s``) so that the daemon's 0.5 s polls see the run step by step.
Every time here is wall-clock (``time.time()``), as the trainer's trace writes it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.testing.servers.s3servers import S3Server
from supervisor.testing.slurm.daemon import SupervisorProcess
from supervisor.testing.slurm.localslurm import LocalSlurm
from supervisor.testing.torch.torchrun import TorchRun

GLOBAL_BATCH = 16  # 2 ranks x --batch 8
STEP_S = 0.1  # --min-step-s
SCAN_INTERVAL_S = 1.0  # TorchRun's [checkpoints] scan_interval_s: how late a new checkpoint is looked at
POISON = (81, 120)  # the spike's poisoned batches: after the steep start, so the noise is the run's own


@dataclass(frozen=True)
class CrashPlan:
    """Steps, checkpoint interval, and when to crash: at ``crash_at`` or, when ``corrupt``, as soon
    as the supervisor has found the overwritten checkpoint (the one at ``corrupt_step``) corrupt."""

    steps: int
    every: int
    crash_at: int
    corrupt: bool = False

    @property
    def corrupt_step(self) -> int:
        return self.crash_at // self.every * self.every


PLAIN_CRASH = CrashPlan(steps=80, every=20, crash_at=50)
# Checkpoints 60 and 120; step 120's is corrupted once the trainer is past it. The crash must come
# before step 180's: 6 s to overwrite the shard (a second after it was written) and for the
# supervisor to scan, verify and find it corrupt (~4 s here). The resumed job saves step 120 again.
CORRUPT_CRASH = CrashPlan(steps=180, every=60, crash_at=121, corrupt=True)


@dataclass
class Outcome:
    """What a scenario left: the trainer's trace, the daemon's logbook and status, and when things
    happened (``marks``: name -> wall-clock time)."""

    run: TorchRun
    book: list[dict[str, Any]]
    status: dict[str, Any]
    marks: dict[str, float] = field(default_factory=dict)
    victim: str | None = None
    corrupted_key: str | None = None

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.book if e["kind"] == kind]

    def story(self) -> str:
        """The logbook, one line per event (for assertion messages)."""
        return "\n".join(f"{e['kind']:>24} {e['message'][:200]}" for e in self.book)

    def first_trained_after(self, when: float) -> float:
        """When a restarted job first trained a step after ``when`` (its trace line), whichever
        attempt it was (one may fail before training and be restarted again)."""
        trace = self.run.trace()
        times = [float(e["time"]) for e in trace if e.get("attempt") != "0" and not e.get("skipped")]
        times = [t for t in times if t > when]
        assert times, f"no step trained after {when}"
        return min(times)


def wait_for(what: str, check: Callable[[], Any], timeout: float, sup: SupervisorProcess, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sup.proc is not None and sup.proc.poll() is not None:
            raise AssertionError(f"daemon exited while waiting for {what}:\n{sup.log_path.read_text()[-3000:]}")
        got = check()
        if got:
            return got
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout} s; logbook:\n{timeline(sup)}")


def timeline(sup: SupervisorProcess, run: str = "gpt") -> str:
    return "\n".join(f"{e['kind']:>24} {e['message'][:200]}" for e in sup.logbook(run))


def last_step(run: TorchRun, attempt: int) -> int:
    return max((e["step"] for e in run.trained(attempt)), default=0)


def completed(sup: SupervisorProcess, run: str = "gpt") -> bool:
    state: object = sup.status(run)["state"]
    return state == "completed"


def s3_run(
    workdir: Path, cluster: LocalSlurm, s3: S3Server, train_args: list[str], *, poison: tuple[int, int] | None = None
) -> tuple[TorchRun, str]:
    """A TorchRun with its checkpoints under a new bucket of ``s3``; (run, bucket)."""
    bucket = f"gpt-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    run = TorchRun(
        workdir,
        cluster.partition,
        f"s3://{bucket}/gpt/",
        spares=cluster.nodes[-1],
        train_args=train_args,
        storage_env={**s3.credentials_env(), "AWS_ENDPOINT_URL": s3.endpoint_url},
        endpoint_url=s3.endpoint_url,
    )
    run.write_corpus(poison=poison, global_batch=GLOBAL_BATCH)
    return run, bucket


def crash(cluster: LocalSlurm, s3: S3Server, workdir: Path, plan: CrashPlan = PLAIN_CRASH) -> Outcome:
    """Train, (corrupt the newest checkpoint,) crash the batch host, wait for the run to complete."""
    args = ["--steps", str(plan.steps), "--ckpt-every", str(plan.every), "--min-step-s", str(STEP_S)]
    run, bucket = s3_run(workdir, cluster, s3, args)
    spec = run.spec(checkpoints="full_verify = true\n" if plan.corrupt else "full_verify = false\n")
    sup = SupervisorProcess(cluster, workdir)
    sup.start(env={**s3.credentials_env(), "PYTHONUNBUFFERED": "1"})  # its log is read as it is written
    marks: dict[str, float] = {}
    key = None
    try:
        sup.cli("submit", str(spec))
        first = sup.wait_running("gpt", attempt=0, interval=0.5)
        wait_for(f"step {plan.crash_at} trained", lambda: last_step(run, 0) >= plan.crash_at, 120, sup, 0.05)
        if plan.corrupt:
            key = corrupt_newest(sup, s3, bucket, plan.corrupt_step, marks)
        victim = first["running_on"][0]  # the batch host, where rank 0 runs
        marks["crash_step"] = last_step(run, 0)
        cluster.crash_node(victim)
        marks["crashed"] = time.time()
        sup.wait_running("gpt", attempt=1, avoid=[victim], timeout=60, interval=0.5)
        wait_for("the run completed", lambda: completed(sup), 120, sup, interval=1.0)
    finally:
        sup.stop()
    return Outcome(run, sup.logbook("gpt"), sup.status("gpt"), marks, victim, key)


def corrupt_newest(sup: SupervisorProcess, s3: S3Server, bucket: str, step: int, marks: dict[str, float]) -> str:
    """Overwrite rank 1's DCP shard of checkpoint ``step``; wait until the supervisor finds it
    corrupt. Returns the object's key."""
    name = checkpoint_name(step)
    key = f"gpt/{name}/__1_0.distcp"
    overwrite_shard(s3, bucket, key)
    marks["corrupted"] = time.time()
    wait_for("the corruption found", lambda: corrupt_found(sup, name), 30, sup, 0.1)
    marks["corruption_found"] = time.time()
    return key


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"  # supervisor.telemetry.torch.Supervision.name


def corrupt_found(sup: SupervisorProcess, name: str) -> bool:
    """Whether the daemon's log says it found checkpoint ``name`` corrupt (the log, not the CLI: a
    CLI call costs a second on a loaded machine, and the next save is a few seconds away)."""
    return any(
        line.get("event") == "checkpoint_checked"
        and line.get("outcome") == "corrupt"
        and str(line.get("location", "")).rstrip("/").endswith(f"/{name}")
        for line in sup.log_lines()
    )


def overwrite_shard(s3: S3Server, bucket: str, key: str, length: int = 64) -> None:
    """Overwrite ``key`` through the S3 API with the same number of bytes, ``length`` of them in the
    middle inverted: a shard damaged after its checkpoint was committed. Done at least a second
    after the original was written, so that its modification time (listed to the second by some
    servers) moves, which is how the supervisor learns that it must look again."""
    client = s3.admin_client()
    written = client.head_object(Bucket=bucket, Key=key)["LastModified"].timestamp()
    time.sleep(max(0.0, written + 1.05 - time.time()))
    data = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    middle = len(data) // 2
    for i in range(middle, min(middle + length, len(data))):
        data[i] ^= 0xFF
    client.put_object(Bucket=bucket, Key=key, Body=bytes(data))


def spike(cluster: LocalSlurm, s3: S3Server, workdir: Path, steps: int = 160) -> Outcome:
    """Poisoned batches POISON planted in the corpus; the run rolls back and completes."""
    args = ["--steps", str(steps), "--ckpt-every", "20", "--min-step-s", str(STEP_S)]
    run, _ = s3_run(workdir, cluster, s3, args, poison=POISON)
    spec = run.spec(
        checkpoints="full_verify = false\n",
        spikes="heal_window_steps = 20\nmin_steps_before = 15\nskip_batches = 70\n",
    )
    sup = SupervisorProcess(cluster, workdir)
    sup.start(env=s3.credentials_env())
    try:
        sup.cli("submit", str(spec))
        sup.wait_running("gpt", attempt=0, interval=0.5)
        sup.wait_running("gpt", attempt=1, timeout=120, interval=0.5)
        wait_for("the run completed", lambda: completed(sup), 90, sup, interval=1.0)
    finally:
        sup.stop()
    return Outcome(run, sup.logbook("gpt"), sup.status("gpt"))


def survivors(cluster: LocalSlurm, workdir: Path, *, save_on_failure: bool = True) -> Outcome:
    """In-allocation mode (2 nodes + 1 hot spare, checkpoints every 20 steps on a directory):
    between two periodic saves one node's rank exits mid-step (a GPU fault's crash, the node
    healthy); the daemon relaunches the step in place from the newest verified checkpoint —
    with ``save_on_failure``, the one the surviving rank saved at the step it completed."""
    root = workdir / "ckpt"
    root.mkdir()
    die = workdir / "die"
    args = ["--steps", "80", "--ckpt-every", "20", "--min-step-s", str(STEP_S), "--die-file", str(die)]
    args += ["--save-on-failure"] if save_on_failure else []
    run = TorchRun(workdir, cluster.partition, str(root), script="train_launch.sbatch", train_args=args)
    run.write_corpus()
    spec = run.spec(
        checkpoints="full_verify = false\nsave_on_failure_s = 20\n",
        restart='mode = "in-allocation"\nhot_spares = 1\nfast_failure_s = 1\nlauncher_timeout_s = 30\n',
    )
    sup = SupervisorProcess(cluster, workdir)
    sup.start(env={"PYTHONUNBUFFERED": "1"})
    marks: dict[str, float] = {}
    try:
        sup.cli("submit", str(spec))
        first = sup.wait_running("gpt", attempt=0, interval=0.5)
        wait_for("step 45 trained", lambda: last_step(run, 0) >= 45, 120, sup, 0.05)
        victim = first["running_on"][1]  # not the batch host: its rank 1 dies, the node stays healthy
        marks["die_step"] = last_step(run, 0) + 2
        die.write_text(f"{victim} {int(marks['die_step'])}")
        wait_for("the rank died", die.with_name("die.done").exists, 30, sup, 0.01)
        marks["died"] = time.time()
        wait_for("the run completed", lambda: completed(sup), 120, sup, interval=0.5)
    finally:
        sup.stop()
    return Outcome(run, sup.logbook("gpt"), sup.status("gpt"), marks, victim)
