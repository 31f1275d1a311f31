"""End-to-end scenarios of a sharded state (examples/torch/train.py ``--layout hsdp``, two ranks a
node) under the real daemon on a real Slurm, shared by tests/e2e and the benches.

* ``hsdp_node_crash``: two nodes and a spare, checkpoints every 20 steps on a directory, save on
  failure; between two periodic saves the node that is not the batch host crashes (slurmd and
  every process on it killed). The other node's replica group holds every shard and saves the step
  it completed; the daemon restarts the run on the healthy node and the spare from that save.
* ``peers_node_crash``: FSDP with no replica and in-memory peer copies, in-allocation with a hot
  spare: a node crashes; the relaunched step restores from the peers' memory.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from supervisor.testing.slurm.daemon import SupervisorProcess
from supervisor.testing.slurm.localslurm import LocalSlurm
from supervisor.testing.torch.torch_scenarios import STEP_S, Outcome, completed, last_step, wait_for
from supervisor.testing.torch.torchrun import TorchRun

HSDP_STEPS = 60


def hsdp_node_crash(cluster: LocalSlurm, workdir: Path, *, crash_after: int = 30) -> Outcome:
    """Crash a node once step ``crash_after`` is trained; wait for the run to complete."""
    root = workdir / "ckpt"
    root.mkdir(parents=True)
    args = ["--layout", "hsdp", "--steps", str(HSDP_STEPS), "--ckpt-every", "20", "--min-step-s", str(STEP_S)]
    run = TorchRun(
        workdir,
        cluster.partition,
        str(root),
        spares=cluster.nodes[-1],
        nproc=2,
        train_args=[*args, "--save-on-failure"],
    )
    run.write_corpus()
    spec = run.spec(checkpoints="full_verify = false\nsave_on_failure_s = 20\n")
    sup = SupervisorProcess(cluster, workdir)
    sup.start(env={"PYTHONUNBUFFERED": "1"})
    marks: dict[str, float] = {}
    try:
        sup.cli("submit", str(spec))
        first = sup.wait_running("gpt", attempt=0, interval=0.5)
        wait_for(f"step {crash_after} trained", lambda: last_step(run, 0) >= crash_after, 120, sup, 0.02)
        victim = first["running_on"][1]  # not the batch host: its replica group dies, the other lives
        marks["crash_step"] = last_step(run, 0)
        cluster.crash_node(victim)
        marks["crashed"] = time.time()
        sup.wait_running("gpt", attempt=1, avoid=[victim], timeout=60, interval=0.5)
        wait_for("the run completed", lambda: completed(sup), 120, sup, interval=0.5)
    finally:
        sup.stop()
    return Outcome(run, sup.logbook("gpt"), sup.status("gpt"), marks, victim)


PEER_STEPS = 60  # a multiple of the checkpoint interval: the last state is saved


def peers_node_crash(cluster: LocalSlurm, workdir: Path, *, crash_after: int = 47) -> Outcome:
    """In-allocation (2 nodes + 1 hot spare, two ranks a node, ``--layout fsdp --peer-copies 5``,
    checkpoints every 20 steps): once step ``crash_after`` is trained the node that is not the
    batch host crashes and its host memory with it (its copies' folder removed: the tests' nodes
    share one /dev/shm). The daemon swaps in the hot spare; the relaunched step restores the newest
    complete generation from the survivors' memory."""
    root, shm = workdir / "ckpt", workdir / "shm"
    root.mkdir(parents=True)
    args = ["--layout", "fsdp", "--steps", str(PEER_STEPS), "--ckpt-every", "20", "--peer-copies", "5"]
    run = TorchRun(
        workdir,
        cluster.partition,
        str(root),
        script="train_launch.sbatch",
        nproc=2,
        train_args=[*args, "--min-step-s", str(STEP_S)],
        storage_env={"SSV_PEER_DIR": str(shm)},
    )
    run.write_corpus()
    spec = run.spec(
        checkpoints="full_verify = false\n",
        restart='mode = "in-allocation"\nhot_spares = 1\nfast_failure_s = 1\nlauncher_timeout_s = 30\n',
    )
    sup = SupervisorProcess(cluster, workdir)
    sup.start(env={"PYTHONUNBUFFERED": "1"})
    marks: dict[str, float] = {}
    try:
        sup.cli("submit", str(spec))
        first = sup.wait_running("gpt", attempt=0, interval=0.5)
        wait_for(f"step {crash_after} trained", lambda: last_step(run, 0) >= crash_after, 120, sup, 0.02)
        victim = first["running_on"][1]
        marks["crash_step"] = last_step(run, 0)
        cluster.crash_node(victim)
        marks["crashed"] = time.time()
        for lost in shm.glob(f"ssv-peers-*-{victim}"):
            shutil.rmtree(lost)
        wait_for("the run completed", lambda: completed(sup), 150, sup, interval=0.5)
    finally:
        sup.stop()
    return Outcome(run, sup.logbook("gpt"), sup.status("gpt"), marks, victim)
