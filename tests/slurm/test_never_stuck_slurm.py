"""A run with no spare left on a real Slurm: it waits for its node, says so, and runs again as soon
as the node is back in service (issue 21, item 0). Slurm 22.05 refuses an sbatch whose
``--exclude`` leaves the partition too small, so the restart must not exclude the drained node."""

from __future__ import annotations

import time

import pytest

from supervisor.testing.slurm.daemon import SupervisorProcess, write_run

pytestmark = pytest.mark.slurm


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} not within {timeout} s")


def test_a_run_without_spares_runs_again_once_its_node_is_back(slurm_cluster, tmp_path):
    sup = SupervisorProcess(slurm_cluster, tmp_path)
    nodes = len(slurm_cluster.nodes)  # the whole partition: no spare at all
    spec = write_run(tmp_path, "llm", nodes=nodes, partition=slurm_cluster.partition, script_body="srun sleep 600\n")
    sup.start()
    try:
        sup.cli("submit", str(spec))
        first = sup.wait_running("llm", attempt=0)
        victim = first["running_on"][0]
        slurm_cluster.crash_node(victim)

        def waiting() -> bool:
            return any(e["kind"] == "waiting_for_nodes" for e in sup.logbook("llm"))

        _wait_for(waiting, 60.0, "a waiting_for_nodes entry")
        assert sup.status("llm")["attempt"] == 1  # submitted, and queued by Slurm (not refused)
        slurm_cluster.restart_node(victim)
        slurm_cluster.run(["scontrol", "update", f"nodename={victim}", "state=resume"], check=True)
        resumed = time.monotonic()
        second = sup.wait_running("llm", attempt=1, timeout=60)
        back = time.monotonic() - resumed
    finally:
        sup.stop()
    book = sup.logbook("llm")
    assert victim in second["running_on"], book
    assert back < 20.0, f"{back:.1f} s from the node's return to the run computing again"
    waited = next(e for e in book if e["kind"] == "waiting_for_nodes")
    assert victim in waited["message"] and f"needs {nodes} nodes" in waited["message"]
    assert not [e for e in book if e["kind"] == "warning" and "not available" in e["message"]], book


def test_a_spec_slurm_refuses_is_refused_at_submit_and_never_retried_in_a_loop(slurm_cluster, tmp_path):
    """Issue 21 item 11: a GRES the cluster does not have. `submit` asks Slurm first (sbatch
    --test-only) and refuses it in Slurm's words; registered anyway (--no-slurm-check), the daemon's
    sbatch is refused and recorded as refused for good (a failed submission with Slurm's error, not
    an open intent retried every tick), and no second sbatch follows at once. What comes next (one
    more try a minute later, then the run blocked and one page) is the engine's decision on that
    record: tests/unit/test_restart_pacing.py pins it (a real minute here would cost the suite 60 s)."""
    from supervisor.adapters.sqlite import SqliteStore

    spec = write_run(tmp_path, "llm", nodes=1, partition=slurm_cluster.partition, script_body="srun sleep 600\n")
    text = spec.read_text().replace("nodes = 1\n", 'nodes = 1\nsbatch_args = ["--gres=gpu:8"]\n')
    spec.write_text(text)
    sup = SupervisorProcess(slurm_cluster, tmp_path)
    sup.start()  # submits go through the daemon's API, which asks Slurm as the instance's account
    store = SqliteStore(sup.state_dir)

    def submits() -> list[dict]:
        return [a for a in store.actions("llm") if a["kind"] == "submit"]

    try:
        refused = sup.cli("submit", str(spec), check=False)
        assert refused.returncode == 1 and "Slurm would refuse" in refused.stderr and "gres" in refused.stderr.lower()
        assert sup.cli("submit", "--no-slurm-check", str(spec)).returncode == 0
        _wait_for(lambda: any(a["status"] == "failed" for a in submits()), 60.0, "the sbatch refused")
        time.sleep(3.0)  # six ticks: a retry loop would have sent sbatch again by now
        assert sup.proc is not None and sup.proc.poll() is None, "the daemon must keep running"
    finally:
        sup.stop()
    (only,) = submits()
    store.close()
    assert only["status"] == "failed" and "gres" in str(only["result"]).lower(), only
    assert sup.status("llm")["state"] != "failed"  # not blocked after one refusal: one more try is due
    assert [e for e in sup.logbook("llm") if e["kind"] == "warning" and "gres" in e["message"].lower()], sup.logbook(
        "llm"
    )
