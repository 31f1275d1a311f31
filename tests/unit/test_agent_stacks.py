"""The node agent's capture (agent/stacks.py): the job's ranks found by their environment, each
dumped by the real py-spy, one bounded line each and a closing line; failures said, not raised."""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from supervisor.agent.stacks import capture, training_processes

PY_SPY = shutil.which("py-spy", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")

TRAINER = textwrap.dedent(
    """
    import sys, time
    def load_batch():
        print("ready", flush=True)
        time.sleep(60)
    load_batch()
    """
)


@pytest.fixture
def py_spy() -> str:
    if PY_SPY is None:
        if os.environ.get("CI", "").strip().lower() == "true":
            pytest.fail("py-spy is required under CI=true (pip install -e '.[test]')")
        pytest.skip("py-spy is not installed")
    return PY_SPY


@pytest.fixture
def ranks(tmp_path):
    procs = []
    for rank in (3, 4):
        env = {**os.environ, "SLURM_JOB_ID": "4242", "RANK": str(rank)}
        p = subprocess.Popen([sys.executable, "-c", TRAINER], env=env, stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
        procs.append(p)
    other = subprocess.Popen([sys.executable, "-c", TRAINER], env={**os.environ, "SLURM_JOB_ID": "1", "RANK": "0"}, stdout=subprocess.PIPE)  # fmt: skip
    yield procs
    for p in [*procs, other]:
        p.kill()
        p.wait()


def run(py_spy: str, job: int = 4242, timeout: float = 20.0) -> list[dict[str, object]]:
    out = io.StringIO()
    args = argparse.Namespace(job=job, timeout=timeout, py_spy=py_spy, native=False, node="n7", again=0.3)
    assert capture(args, out) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_the_jobs_ranks_are_dumped_and_the_node_closes(py_spy, ranks):
    began = time.monotonic()
    lines = run(py_spy)
    assert time.monotonic() - began < 10
    found = {line["rank"]: line for line in lines if "rank" in line}
    assert sorted(found) == [3, 4]
    frames = found[3]["threads"][0]["frames"]  # type: ignore[index]
    assert frames[0][0] == "load_batch" and found[3]["pid"] == ranks[0].pid
    assert found[3]["moved"] is False  # asleep: the same stack in both samples
    assert lines[-1] == {"node": "n7", "closing": True, "processes": 2, "error": None, "took_s": lines[-1]["took_s"]}


def test_no_training_process_and_a_missing_py_spy_are_said(py_spy, ranks, tmp_path):
    assert run(py_spy, job=999)[-1]["error"] == "no training process of job 999 on this node"
    lines = run(str(tmp_path / "no-py-spy"))
    assert lines[0]["error"].startswith("py-spy not found") and lines[0]["threads"] == []
    assert lines[-1]["error"].startswith("py-spy not found")


def test_processes_are_found_by_their_environment_in_a_proc_folder(tmp_path):
    def proc(pid: int, comm: str, **env: str) -> None:
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()))
        (d / "comm").write_text(comm + "\n")

    proc(10, "python3", SLURM_JOB_ID="5", RANK="1", SLURMD_NODENAME="n1")
    proc(14, "python3", SLURM_JOB_ID="5", RANK="0", SLURMD_NODENAME="n0")  # another node on this host
    proc(11, "torchrun", SLURM_JOB_ID="5")  # the launcher: no rank
    proc(12, "python3", SLURM_JOB_ID="6", RANK="0")  # another job
    proc(13, "python3", SLURM_JOB_ID="5", RANK="x1")  # not a rank
    (tmp_path / "self").mkdir()
    assert [(t.pid, t.rank) for t in training_processes(5, "n1", tmp_path)] == [(10, 1)]
    proc(20, "python3", SLURM_JOB_ID="7", SLURM_PROCID="2", SLURM_STEP_ID="0")
    proc(21, "python3", SLURM_JOB_ID="7", SLURM_PROCID="0", SLURM_STEP_ID="9")  # the capture's own step
    proc(22, "bash", SLURM_JOB_ID="7", SLURM_PROCID="0", SLURM_STEP_ID="0")
    found = training_processes(7, "n1", tmp_path, own={"SLURM_STEP_ID": "9"})
    assert [(t.pid, t.rank) for t in found] == [(20, 2)]
