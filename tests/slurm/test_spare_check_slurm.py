"""The launcher's pre-flight check of the hot spares on a real Slurm with the real daemon (issue 16):
an in-allocation run (2 nodes + 1 hot spare, ``--no-kill``) whose spare's GPU is lost. The
launcher starts generation 0 and, beside it, this installation's ``agent --once --send`` on the
spare (its default check); from that one report — no agent runs anywhere else — the daemon keeps
the spare out of the hot spares and drains it with the evidence, before any swap is needed, while
generation 0 runs on undisturbed in the same job.

Every node would read the same stand-in NVML state (one fatal GPU): the nodes share this host, the
run's spec may not set LD_* for the job, and only the default check argv is exercised this way. So
a check that ran on a step node would fault that node too: the test sees that it did not."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from test_in_allocation_slurm import STEP, beats, wait

from supervisor.adapters.slurm.cli import SlurmCli
from supervisor.adapters.slurm.reads import own_account
from supervisor.testing.kit.nvml_standin import NvmlStandin, StandinBuildError, build_standin
from supervisor.testing.slurm.daemon import SupervisorProcess, write_run

pytestmark = [pytest.mark.slurm, pytest.mark.nvml]


@pytest.fixture(scope="module")
def standin_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return build_standin(tmp_path_factory.mktemp("nvml-lib"))
    except StandinBuildError as exc:
        if os.environ.get("CI", "").strip().lower() == "true":
            pytest.fail(f"the NVML stand-in is required under CI=true but cannot be built: {exc}", pytrace=False)
        pytest.skip(f"the NVML stand-in cannot be built: {exc}")


def spec_with_a_lost_gpu(cluster, tmp_path: Path, library: Path) -> tuple[Path, Path]:
    gpus = NvmlStandin(library, tmp_path / "nvml-state.json")
    gpus.gpu(6, lost=1)
    marks = tmp_path / "marks.txt"
    marks.touch()
    body = (
        f"export LD_LIBRARY_PATH={library.parent} NVML_STANDIN_STATE={gpus.state_path}\n"
        f"exec {sys.executable} -m supervisor launch --poll 0.2 --decision-wait 20 -- bash -c '{STEP}'\n"
    )
    spec = write_run(tmp_path, "llm", nodes=2, partition=cluster.partition, script_body=body, env={"MARKS": str(marks)})
    spec.write_text(spec.read_text() + 'mode = "in-allocation"\nhot_spares = 1\nlauncher_timeout_s = 30\n')
    return spec, marks


def test_a_spare_with_a_lost_gpu_is_drained_from_the_pre_flight_report_alone(slurm_cluster, tmp_path, standin_library):
    spec, marks = spec_with_a_lost_gpu(slurm_cluster, tmp_path, standin_library)
    sup = SupervisorProcess(slurm_cluster, tmp_path)
    sup.start()
    cli = SlurmCli(slurm_conf=str(slurm_cluster.slurm_conf))
    try:
        sup.cli("submit", str(spec))
        first = sup.wait_running("llm", attempt=0)
        job = str(first["job_id"])
        started = time.monotonic()
        wait(lambda: len(beats(marks).get((job, "0"), ())) == 2, 30, "generation 0 on two nodes")
        step = {n.split("@")[0] for n in beats(marks)[(job, "0")]}
        # The allocation as the job started: the spare leaves the job's node list once it is DOWN
        # (--no-kill), which may come before this line (CI saw it).
        (spare,) = set(first["running_on"]) - step
        wait(lambda: cli.snapshot().nodes[spare].drained, 30, f"the spare {spare} drained")
        took = time.monotonic() - started
        out = tmp_path / f"llm-{job}.out"
        wait(lambda: "launcher_spare_check_found_fatal" in out.read_text(errors="replace"), 10, "the launcher's log")
        time.sleep(1.0)  # the step beats on, on the same nodes, in the same job
        book, status = sup.logbook("llm"), sup.status("llm")
        still = {n.split("@")[0] for n in beats(marks)[(job, "0")]}
    finally:
        assert sup.stop() == 0
    checks = [json.loads(line) for line in out.read_text().splitlines() if line.startswith('{"node"')]
    assert [(c["node"], c["sent"], [f["rule"] for f in c["findings"]]) for c in checks] == [
        (spare, True, ["gpu-lost@1"])
    ]
    node = cli.snapshot().nodes[spare]
    assert node.reason.startswith(f"slurm-supervisor: run {own_account()}/llm:") and "lost" in node.reason, node.reason
    fault = next(e for e in book if e["kind"] == "fault" and spare in e["message"])
    assert "gpu-lost@1" in fault["message"] and "agent" in fault["message"], fault
    assert not any(e["message"].startswith("swap in job") for e in book), [e["message"] for e in book]
    assert not any(e["kind"] in ("restarted", "stopped") for e in book)
    assert status["job_id"] == first["job_id"] and status["attempt"] == 0 and status["state"] == "running"
    assert still == step and not any(cli.snapshot().nodes[n].drained for n in step)
    assert list(beats(marks)) == [(job, "0")]  # no other generation, no other job
    print(f"pre-flight: spare {spare} drained {took:.1f} s after the job started running")
