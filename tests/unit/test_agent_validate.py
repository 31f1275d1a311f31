"""The node's validation (agent/validate.py): its rendezvous from torchrun's or Slurm's variables,
dcgmi's verdict, and a real three-rank validation over gloo on this host (the node, two good
peers): every figure measured, judged by the domain's rules; a world of two with nothing to compare
the collective with says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from supervisor.agent.validate import _dcgm_result, burn, rendezvous
from supervisor.domain.health.validation import ValidationFigures, ValidationSettings, judge


def test_the_rendezvous_comes_from_torchrun_or_slurm():
    rank, world, env = rendezvous({"RANK": "1", "WORLD_SIZE": "3", "MASTER_ADDR": "h", "MASTER_PORT": "7"})
    assert (rank, world, env["MASTER_ADDR"], env["MASTER_PORT"]) == (1, 3, "h", "7")
    rank, world, env = rendezvous(
        {"SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_JOB_NODELIST": "gpu[7-9]", "SLURM_JOB_ID": "1234"}
    )
    assert (rank, world, env["MASTER_ADDR"], env["MASTER_PORT"]) == (2, 3, "gpu7", "29634")
    _, _, env = rendezvous(
        {
            "SLURM_PROCID": "0",
            "SLURM_NTASKS": "3",
            "SLURM_JOB_NODELIST": "gpu[7-9]",
            "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.7",
        }
    )
    assert env["MASTER_ADDR"] == "10.0.0.7"  # srun's batch host: a node name may not resolve


def test_dcgmi_results():
    assert (
        _dcgm_result(b'{"DCGM GPU Diagnostic": {"test_categories": [{"tests": [{"results": [{"status": "Pass"}]}]}]}}')
        == "Pass"
    )
    assert _dcgm_result(b'{"x": [{"status": "Fail"}]}') == "Fail"
    assert _dcgm_result(b"not json").startswith("Fail")


def test_the_burn_measures_throughput():
    assert burn(0.2) > 0


def run_world(world: int) -> list[subprocess.CompletedProcess[str]]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world)}
    argv = [sys.executable, "-P", "-m", "supervisor.agent.validate", "--burn-s", "0.5", "--collective-mb", "4"]
    procs = [
        subprocess.Popen(argv, env={**env, "RANK": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(world)
    ]
    done = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        done.append(subprocess.CompletedProcess(argv, p.returncode, out, err))
    return done


def figures(line: str) -> ValidationFigures:
    data = json.loads(line)
    return ValidationFigures(**{**data, "oneshot": tuple(data["oneshot"])})


@pytest.mark.torch
def test_a_three_rank_validation_measures_and_compares_every_figure():
    node, *peers = run_world(3)
    assert node.returncode == 0 and all(p.returncode == 0 and p.stdout == "" for p in peers), node.stderr
    f = figures(node.stdout)
    assert f.burn and f.burn_expected and f.collective_gbps and f.peers_gbps and not f.errors, f
    lenient = ValidationSettings(burn_min_share=0.05, collective_min_share=0.05)  # a shared 2-core host
    assert judge(f, lenient).passed, judge(f, lenient).reasons


@pytest.mark.torch
def test_two_ranks_without_a_reference_cannot_pass():
    node, _ = run_world(2)
    f = figures(node.stdout)
    assert f.peers_gbps is None and "nothing to compare with" in f.errors["collective"]
    assert not judge(f, ValidationSettings()).passed
