"""End-to-end scenarios of a sharded state (examples/torch/train.py ``--layout hsdp``, two ranks a
node) under the real daemon on a real Slurm, shared by tests/e2e and the benches.

* ``hsdp_node_crash``: two nodes and a spare, checkpoints every 20 steps on a directory, save on
  failure; between two periodic saves the node that is not the batch host crashes (slurmd and
  every process on it killed). The other node's replica group holds every shard and saves the step
  it completed; the daemon restarts the run on the healthy node and the spare from that save.
"""

from __future__ import annotations

import time
from pathlib import Path

from supervisor.testing.daemon import SupervisorProcess
from supervisor.testing.localslurm import LocalSlurm
from supervisor.testing.torch_scenarios import STEP_S, Outcome, completed, last_step, wait_for
from supervisor.testing.torchrun import TorchRun

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
