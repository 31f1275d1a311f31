"""Node agents on a real Slurm, reporting to the real daemon: an XID 79 on one node's GPU makes the
daemon drain that node (not down it: it still answers) and restart the run on the others, within
an agent interval and a tick or two; a frozen node is caught by its silent agent long before
Slurm's own SlurmdTimeout.

The agents run as an overlapping job step, one per node, each reading the stand-in NVML through
the real pynvml; every node has its own stand-in state file (the nodes share this host)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from supervisor.adapters.slurm.cli import SlurmCli
from supervisor.testing.kit.nvml_standin import NvmlStandin
from supervisor.testing.slurm.daemon import SupervisorProcess, spared_run

pytestmark = [pytest.mark.slurm, pytest.mark.nvml]

SCRIPT = """\
srun --overlap --ntasks-per-node=1 bash -c 'NVML_STANDIN_STATE="$STATE_DIR/$SLURMD_NODENAME.json" \
LD_LIBRARY_PATH="$NVML_LIB_DIR" exec "$PY" -m supervisor agent --interval 1' &
srun --ntasks-per-node=1 sleep 3600
"""


def nodes_of(cluster, library: Path, state_dir: Path) -> dict[str, NvmlStandin]:
    state_dir.mkdir(parents=True, exist_ok=True)
    return {n: NvmlStandin(library, state_dir / f"{n}.json") for n in cluster.nodes}


def start(cluster, tmp_path, standin_library, heartbeat: str = ""):
    gpus = nodes_of(cluster, standin_library, tmp_path / "nvml")
    spec = spared_run(
        cluster,
        tmp_path,
        script_body=SCRIPT,
        env={"STATE_DIR": str(tmp_path / "nvml"), "PY": sys.executable, "NVML_LIB_DIR": str(standin_library.parent)},
    )
    sup = SupervisorProcess(cluster, tmp_path, extra=heartbeat)
    sup.start()
    sup.cli("submit", str(spec))
    return sup, gpus


def _json_lines(path: Path) -> list[dict]:
    lines = []
    for raw in path.read_text(errors="replace").splitlines():
        try:
            lines.append(json.loads(raw))
        except json.JSONDecodeError:
            continue  # the job's other output
    return [e for e in lines if isinstance(e, dict)]


def wait_agents_up(workdir: Path, nodes, timeout: float = 30.0, interval_s: float = 1.0) -> None:
    """Until every node's agent has started (its ``agent_started`` line in the job's output), then
    two agent intervals: its first sample (NVML opened, XID events registered) goes out at once.
    The daemon logs nothing per accepted report, so the agents' own output is what says so."""
    deadline = time.monotonic() + timeout
    started: set[str] = set()
    while not set(nodes) <= started:
        assert time.monotonic() < deadline, f"agents on {sorted(set(nodes) - started)} did not start in {timeout} s"
        time.sleep(0.2)
        for out in workdir.glob("llm-*.out"):
            started |= {e.get("node") for e in _json_lines(out) if e.get("event") == "agent_started"}
    time.sleep(2 * interval_s)


def test_an_xid_79_drains_the_node_and_restarts_the_run_within_seconds(slurm_cluster, tmp_path, standin_library):
    sup, gpus = start(slurm_cluster, tmp_path, standin_library)
    try:
        first = sup.wait_running("llm", attempt=0)
        wait_agents_up(tmp_path, first["running_on"])
        victim = first["running_on"][1]
        injected = time.monotonic()
        gpus[victim].xid(3, 79)
        sup.wait_running("llm", attempt=1, avoid=[victim], timeout=60, interval=0.05)
        latency = time.monotonic() - injected
    finally:
        rc = sup.stop()
    assert rc == 0
    node = SlurmCli(slurm_conf=str(slurm_cluster.slurm_conf)).snapshot().nodes[victim]
    assert node.drained and not node.down and "XID 79" in node.reason, node
    assert latency < 15.0, f"XID to restart took {latency:.1f} s"
    faults = [e for e in sup.logbook("llm") if e["kind"] == "fault" and e["evidence"].get("node") == victim]
    assert faults and "xid-79" in faults[0]["message"]
    print(f"XID 79 injected -> run restarted without {victim}: {latency:.2f} s")


def test_a_frozen_node_is_caught_by_its_silent_agent_before_slurm_notices(make_slurm, tmp_path, standin_library):
    """Ours: the fault in the logbook. Slurm's: an idle bystander frozen at the same moment, until
    Slurm flags it NOT_RESPONDING — after its next ping fails: pings go every SlurmdTimeout/3 (10 s
    here; 100 s with the default 300 s) and fail after MessageTimeout (5 s here, 10 s default)."""
    # KillWait 5 (Slurm's default: 30): the restart waits KillWait + a margin for the old job left
    # COMPLETING on its healthy node, as in test_daemon_slurm's frozen batch host; not this test's subject.
    cluster = make_slurm(5, extra_conf={"SlurmdTimeout": "30", "KillWait": "5"})
    sup, _ = start(
        cluster,
        tmp_path,
        standin_library,
        heartbeat="[health]\nheartbeat_timeout_s = 4\nheartbeat_startup_grace_s = 5\n",
    )
    cli = SlurmCli(slurm_conf=str(cluster.slurm_conf))
    try:
        first = sup.wait_running("llm", attempt=0)
        time.sleep(8.0)  # past the heartbeat grace; agents report every second
        victim = first["running_on"][0]
        bystander = cluster.nodes[-1]  # the run's named spare: idle, and never a node of its restart
        assert cli.snapshot().nodes[bystander].idle
        cluster.freeze_node(victim)  # slurmd and the agent stop; the slurmd port still accepts
        cluster.freeze_node(bystander)
        frozen = time.monotonic()
        ours = slurms = None
        while time.monotonic() - frozen < 90 and (ours is None or slurms is None):
            if ours is None and any(
                e["kind"] == "fault" and e["evidence"].get("node") == victim for e in sup.logbook("llm")
            ):
                ours = time.monotonic() - frozen
            if slurms is None and not cli.snapshot().nodes[bystander].responding:
                slurms = time.monotonic() - frozen
            time.sleep(0.25)
        sup.wait_running("llm", attempt=1, avoid=[victim], timeout=90, interval=0.2)
    finally:
        sup.stop()
        cluster.thaw_node(victim)
        cluster.thaw_node(bystander)
    print(f"frozen node detected: supervisor (agent heartbeat) {ours:.1f} s, Slurm (SlurmdTimeout=30) {slurms:.1f} s")
    fault = next(e for e in sup.logbook("llm") if e["kind"] == "fault" and e["evidence"].get("node") == victim)
    assert "agent silent" in fault["message"], fault
    assert ours is not None and slurms is not None and ours < 10.0
