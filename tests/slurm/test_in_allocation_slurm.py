"""In-allocation recovery on a real Slurm with the real daemon (docs/in-allocation.md): a 2-node run
with one hot spare in a ``--no-kill`` job; a run node is crashed; the step runs again on the
survivor and the spare in the same job id, the dead node drained, and the logbook says
fault -> swap -> resumed from checkpoint N. With the daemon killed at a swap's boundaries: still
exactly one swap, no second job."""

from __future__ import annotations

import socket
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from supervisor.adapters.checkpoints.commit import build_manifest, commit_checkpoint
from supervisor.adapters.checkpoints.posix import PosixBackend
from supervisor.adapters.slurm.cli import SlurmCli
from supervisor.adapters.slurm.reads import own_account
from supervisor.testing.slurm.daemon import SupervisorProcess, write_run

pytestmark = pytest.mark.slurm

STEP = "while true; do echo \"beat $SLURM_JOB_ID $SSV_STEP_GENERATION $SLURMD_NODENAME ${SSV_RESUME_STEP:-none}\" >> \"$MARKS\"; sleep 0.2; done"  # fmt: skip


def start(cluster, tmp_path: Path, step: str = STEP, restart: str = "") -> tuple[Path, Path]:
    """The run spec (in-allocation, one hot spare, a verified checkpoint at step 100) and the marks file."""
    root = tmp_path / "ckpt"
    (root / "step_000100").mkdir(parents=True)
    (root / "step_000100" / "model.pt").write_bytes(b"w" * 4096)
    backend = PosixBackend(str(root))
    commit_checkpoint(backend, "step_000100", build_manifest(backend, "step_000100", 100, writer="rank0"))
    marks = tmp_path / "marks.txt"
    marks.touch()
    body = f"exec {sys.executable} -m supervisor launch --poll 0.2 --decision-wait 20 -- bash -c '{step}'\n"
    env = {"MARKS": str(marks), "FAIL": str(tmp_path / "fail")}
    spec = write_run(tmp_path, "llm", nodes=2, partition=cluster.partition, script_body=body, env=env)
    spec.write_text(
        spec.read_text()
        + f'mode = "in-allocation"\nhot_spares = 1\nlauncher_timeout_s = 30\n{restart}'
        + f'[checkpoints]\nroot = "{root}"\nscan_interval_s = 1\n'
    )
    return spec, marks


def beats(marks: Path) -> dict[tuple[str, str], set[str]]:
    """(job, generation) -> the nodes that step ran on (and the resume step it was handed)."""
    out: dict[tuple[str, str], set[str]] = defaultdict(set)
    for line in marks.read_text().splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[0] == "beat":
            out[(parts[1], parts[2])].add(f"{parts[3]}@{parts[4]}")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} not within {timeout} s")


def generation_0(sup: SupervisorProcess, spec: Path, marks: Path) -> tuple[dict, str]:
    """Submit the run and wait until generation 0 beats on its two nodes: the first status, the job id."""
    sup.cli("submit", str(spec))
    first = sup.wait_running("llm", attempt=0)
    job = str(first["job_id"])
    wait(lambda: len(beats(marks).get((job, "0"), ())) == 2, 30, "generation 0 on two nodes")
    return first, job


def swap_once(cluster, tmp_path: Path, *crash_at: str) -> tuple[SupervisorProcess, dict, float]:
    """Run to generation 0 on two nodes, crash the run node that is not the batch host, and wait
    for generation 1 (daemon restarted once if ``crash_at`` killed it). Returns the process, the
    first status and the swap's duration (crash to the step beating again)."""
    sup = SupervisorProcess(cluster, tmp_path, ingest_port=free_port())  # the same URL after a restart
    spec, marks = start(cluster, tmp_path)
    sup.start()
    first, job = generation_0(sup, spec, marks)
    if crash_at:
        assert sup.stop() == 0
        sup.start(f"--crash-at={crash_at[0]}")
    victim = sorted(n.split("@")[0] for n in beats(marks)[(job, "0")])[1]  # the batch host is the first
    crashed = time.monotonic()
    cluster.crash_node(victim)
    if crash_at:
        sup.wait_exit(30)
        sup.start()
    try:
        wait(lambda: len(beats(marks).get((job, "1"), ())) == 2, 45, "generation 1 on two nodes")
    except AssertionError:
        print("\n".join(e["message"] for e in sup.logbook("llm")), marks.read_text()[-1500:])
        raise
    return sup, first, time.monotonic() - crashed


def test_a_crashed_node_is_replaced_by_the_hot_spare_in_the_same_job(slurm_cluster, tmp_path):
    sup, first, took = swap_once(slurm_cluster, tmp_path)
    try:
        marks = beats(tmp_path / "marks.txt")
        job = str(first["job_id"])
        gen0 = {n.split("@")[0] for n in marks[(job, "0")]}
        gen1 = {n.split("@")[0] for n in marks[(job, "1")]}
        victim = sorted(gen0)[1]
        assert victim not in gen1 and len(gen0 & gen1) == 1  # the survivor and the spare
        assert {n.split("@")[1] for n in marks[(job, "1")]} == {"100"}  # resumed from checkpoint 100
        wait(lambda: any("running again" in e["message"] for e in sup.logbook("llm")), 10, "resumed line")
        status = sup.status("llm")
    finally:
        assert sup.stop() == 0
    assert status["job_id"] == first["job_id"] and status["attempt"] == 0 and status["restarts"]["spent"] == 0
    node = SlurmCli(slurm_conf=str(slurm_cluster.slurm_conf)).snapshot().nodes[victim]
    assert node.drained and node.reason.startswith(f"slurm-supervisor: run {own_account()}/llm:")
    book = sup.logbook("llm")
    fault = next(i for i, e in enumerate(book) if e["kind"] == "fault" and victim in e["message"])
    swap = next(i for i, e in enumerate(book) if e["message"].startswith("swap in job"))
    resumed = next(i for i, e in enumerate(book) if "running again" in e["message"])
    assert fault < swap < resumed, [e["message"] for e in book]
    assert "resumed from checkpoint step 100" in book[resumed]["message"]
    assert not any(e["kind"] in ("restarted", "stopped") for e in book)
    print(f"in-allocation swap: {took:.1f} s from the crash to the step beating again")


@pytest.mark.parametrize("crash_at", ["after_intent:swap_step", "after_execute:swap_step", "after_intent:node_state"])
def test_a_daemon_killed_mid_swap_swaps_exactly_once(slurm_cluster, tmp_path, crash_at):
    sup, first, _ = swap_once(slurm_cluster, tmp_path, crash_at)
    try:
        time.sleep(1.0)
        book = sup.logbook("llm")
        status = sup.status("llm")
    finally:
        assert sup.stop() == 0
    assert status["job_id"] == first["job_id"] and status["attempt"] == 0
    assert len([e for e in book if e["message"].startswith("swap in job")]) == 1
    assert not any(k in beats(tmp_path / "marks.txt") for k in ((str(first["job_id"]), "2"),))
    jobs = SlurmCli(slurm_conf=str(slurm_cluster.slurm_conf)).snapshot().jobs
    assert [j for j in jobs.values() if j.name == "llm" and not j.state.finished] == [jobs[first["job_id"]]]


def test_the_batch_host_dying_falls_back_to_resubmission_with_the_reason(slurm_cluster, tmp_path):
    sup = SupervisorProcess(slurm_cluster, tmp_path)
    spec, marks = start(slurm_cluster, tmp_path)
    sup.start()
    try:
        first, job = generation_0(sup, spec, marks)
        host = sorted(n.split("@")[0] for n in beats(marks)[(job, "0")])[0]
        slurm_cluster.crash_node(host)
        second = sup.wait_running("llm", attempt=1, avoid=[host], timeout=45)
        book = [e["message"] for e in sup.logbook("llm")]
    finally:
        assert sup.stop() == 0
    assert second["job_id"] != first["job_id"] and second["restarts"]["spent"] == 1
    assert any(f"the batch host {host} (where the launcher runs) is faulty" in m and "falling back" in m for m in book)
    assert not any(m.startswith("swap in job") for m in book)


# Generation 0 exits 1 once the test creates $FAIL: a software fault, no node at fault.
FAILING = "while true; do if [ \"$SSV_STEP_GENERATION\" = 0 ] && [ -e \"$FAIL\" ]; then exit 1; fi; echo \"beat $SLURM_JOB_ID $SSV_STEP_GENERATION $SLURMD_NODENAME ${SSV_RESUME_STEP:-none}\" >> \"$MARKS\"; sleep 0.2; done"  # fmt: skip


def test_a_step_that_fails_with_no_node_at_fault_is_relaunched_in_place(slurm_cluster, tmp_path):
    """The step exits 1 on healthy nodes: the next generation runs on the same two nodes in the same
    job, from checkpoint 100, one restart spent — no second job, nothing drained."""
    sup = SupervisorProcess(slurm_cluster, tmp_path, ingest_port=free_port())
    # A failure this soon after the launch is no fast failure: the step fails ~1 s after it starts,
    # and Slurm's start time has whole seconds (with 1 s, CI saw it taken for a fast failure).
    spec, marks = start(slurm_cluster, tmp_path, FAILING, "fast_failure_s = 0.01\n")
    sup.start()
    try:
        first, job = generation_0(sup, spec, marks)
        (tmp_path / "fail").touch()
        failed = time.monotonic()
        wait(lambda: len(beats(marks).get((job, "1"), ())) == 2, 30, "generation 1 on two nodes")
        took = time.monotonic() - failed
        wait(lambda: any("running again" in e["message"] for e in sup.logbook("llm")), 10, "resumed line")
        status, book = sup.status("llm"), sup.logbook("llm")
    finally:
        assert sup.stop() == 0
    gen0, gen1 = beats(marks)[(job, "0")], beats(marks)[(job, "1")]
    assert {n.split("@")[0] for n in gen1} == {n.split("@")[0] for n in gen0}  # the same nodes
    assert {n.split("@")[1] for n in gen1} == {"100"}  # resumed from checkpoint 100
    assert status["job_id"] == first["job_id"] and status["attempt"] == 0 and status["restarts"]["spent"] == 1
    messages = [e["message"] for e in book]
    fault = next(i for i, m in enumerate(messages) if "exited with code 1" in m and "relaunching it in place" in m)
    relaunched = next(i for i, m in enumerate(messages) if m.startswith("relaunched in job"))
    resumed = next(i for i, m in enumerate(messages) if "running again" in m)
    assert fault < relaunched < resumed, messages
    assert not any(e["kind"] in ("restarted", "stopped", "node_drained") for e in book), messages
    print(f"in-allocation relaunch: {took:.1f} s from the step's failure to the step beating again")
