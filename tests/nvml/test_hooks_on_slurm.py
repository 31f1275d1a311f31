"""The hooks in a real Slurm: slurm.conf's Prolog runs `slurm-supervisor hook prolog` (through a
site wrapper that points each node at its own stand-in NVML, since the nodes share this host);
a GPU fallen off the bus on one node fails the prolog, Slurm drains the node and requeues the
job held, the supervisor releases it and the run starts on healthy nodes; the daemon hears the
prolog's report. The healthcheck drains a node through the real scontrol."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.adapters.slurm.cli import SlurmCli
from supervisor.adapters.sqlite import SqliteStore
from supervisor.domain.records import Verdict
from supervisor.testing.kit.nvml_standin import NvmlStandin
from supervisor.testing.slurm.daemon import SupervisorProcess, spared_run

pytestmark = [pytest.mark.slurm, pytest.mark.nvml]

HOOK_TOKEN = "site-hook-token-for-the-test-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def site_wrapper(tmp_path: Path, library: Path, config: Path, kind: str) -> Path:
    """What a site's slurm.conf would point at, plus the per-node stand-in of this test."""
    repo = Path(__file__).resolve().parents[2]
    script = tmp_path / f"{kind}.sh"
    script.write_text(
        "#!/bin/sh\n"
        f'export NVML_STANDIN_STATE="{tmp_path}/nvml/$SLURMD_NODENAME.state" LD_LIBRARY_PATH="{library.parent}"\n'
        f'export SLURM_SUPERVISOR_PYTHON="{sys.executable}" PYTHONPATH="{repo}" '
        f'SLURM_SUPERVISOR_HOOKS_CONFIG="{config}"\n'
        f'exec "{repo}/hooks/{kind}" 2>>"{tmp_path}/{kind}.log"\n'
    )
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("mode", ["resubmit", "requeue"])
def test_a_prolog_fault_drains_the_node_and_the_run_starts_on_healthy_nodes(
    make_slurm, tmp_path, standin_library, mode
):
    """resubmit (sbatch --no-requeue): Slurm cancels the job it cannot requeue; the supervisor sees
    the prolog's drain and restarts. requeue: Slurm requeues it held; the supervisor releases it."""
    port = free_port()
    token = tmp_path / "hook.token"
    token.write_text(HOOK_TOKEN)
    token.chmod(0o600)
    config = tmp_path / "hooks.toml"
    config.write_text(
        f'[hooks]\nurl = "http://127.0.0.1:{port}"\ntoken_file = "{token}"\nspool_dir = "{tmp_path / "spool"}"\n'
    )
    cluster = make_slurm(4, extra_conf={"Prolog": str(site_wrapper(tmp_path, standin_library, config, "prolog"))})
    (tmp_path / "nvml").mkdir()
    gpus = {n: NvmlStandin(standin_library, tmp_path / "nvml" / f"{n}.state") for n in cluster.nodes}
    bad = cluster.nodes[0]  # the first node Slurm gives the run
    gpus[bad].gpu(3, lost=1)
    spec = spared_run(
        cluster,
        tmp_path,
        script_body="srun --ntasks-per-node=1 sleep 3600\n",
    )
    with spec.open("a") as f:
        f.write(f'mode = "{mode}"\n')
    sup = SupervisorProcess(cluster, tmp_path, ingest_port=port, hook_token_file=token)
    sup.start()
    try:
        sup.cli("submit", str(spec))
        running = sup.wait_running("llm", attempt=1, avoid=[bad], timeout=90)
        time.sleep(1.0)
    finally:
        sup.stop()
    node = SlurmCli(slurm_conf=str(cluster.slurm_conf)).snapshot().nodes[bad]
    assert node.drained and "prolog" in node.reason.lower(), node
    book = sup.logbook("llm")
    if mode == "requeue":  # released from Slurm's hold, or requeued once the prolog's report drained it
        assert {"released", "requeued"} & {e["kind"] for e in book}, [e["kind"] for e in book]
    else:
        fault = next(e for e in book if e["kind"] == "fault")
        assert "prolog" in fault["message"].lower() and any(e["kind"] == "restarted" for e in book)
    assert bad not in running["running_on"]
    verdicts = {v.node: v for v in SqliteStore(sup.state_dir).verdicts()}
    assert verdicts[bad].verdict is Verdict.BAD and "prolog" in verdicts[bad].reason.lower(), verdicts[bad]
    assert "GPU" in (tmp_path / "prolog.log").read_text()


def test_the_healthcheck_drains_a_node_through_the_real_scontrol(slurm_cluster, tmp_path, standin_library):
    node = slurm_cluster.nodes[1]
    gpu = NvmlStandin(standin_library, tmp_path / "state")
    gpu.gpu(0, lost=1)
    config = tmp_path / "hooks.toml"
    config.write_text(f'[hooks]\nspool_dir = "{tmp_path / "spool"}"\n')
    env = {**os.environ, **slurm_cluster.env, **gpu.env, "SLURMD_NODENAME": node}
    done = subprocess.run(
        [sys.executable, "-m", "supervisor", "hook", "healthcheck", "--config", str(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        info = SlurmCli(slurm_conf=str(slurm_cluster.slurm_conf)).snapshot().nodes[node]
        if info.drained:
            break
        time.sleep(0.2)
    assert info.drained and info.reason.startswith("slurm-supervisor healthcheck: "), info
