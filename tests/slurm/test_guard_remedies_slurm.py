"""The guard's remedies on a real Slurm with the harness's RebootProgram (``LocalSlurm(reboot=True)``):
a user who drained a node of its own job holds it in a maintenance reservation, reboots it through
Slurm (the node really "reboots": its slurmd comes back with a new boot time, into the
reservation), validates it there (``agent/validate.py`` on the node and two good peers outside the
reservation: FLEX) while another user's job waits, and returns it to service; another user may do
none of it."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from test_guard_slurm import GuardProcess, cli_as, node, public_tmp, running_nodes, user_env, users

from supervisor.domain.health.validation import ValidationFigures, ValidationSettings, judge
from supervisor.testing import LocalSlurm
from supervisor.testing.slurm.users import as_user, local_user, python_for_others

# torch: the validation job trains a few steps with torch.distributed (agent/validate.py), which the
# release roots of the matrix do not have: the test runs on the host's Slurm only.
pytestmark = [pytest.mark.slurm, pytest.mark.torch]
__all__ = ["public_tmp"]  # the fixture, used by name


def boot_time(cluster: LocalSlurm, name: str) -> str:
    shown = cluster.run(["scontrol", "-o", "show", "node", name], check=True).stdout
    found = re.search(r"BootTime=(\S+)", shown)
    assert found, shown
    return found.group(1)


def sbatch(cluster: LocalSlurm, user: str, *args: str) -> int:
    argv = ["sbatch", "--parsable", "-N1", "--output=/dev/null", *args]
    done = as_user(user, argv, env=user_env(cluster, user), cwd="/tmp")
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


def validation_job(cluster: LocalSlurm, user: str, node: str, out: Path) -> int:
    """The node's validation in its reservation, with two good peers outside it (FLEX)."""
    python = " ".join(python_for_others()[0])
    command = f"srun {python} -P -m supervisor.agent.validate --node {node} --burn-s 1 --collective-mb 4"
    return sbatch(cluster, user, "-N3", "--ntasks-per-node=1", f"--nodelist={node}",
                  f"--reservation=ssv-maint-{node}", f"--output={out}", "--wrap", command)  # fmt: skip


def figures(out: Path) -> ValidationFigures:
    lines = out.read_text().strip().splitlines()
    assert lines and lines[-1].startswith("{"), "\n".join(lines[-30:])
    data = json.loads(lines[-1])
    return ValidationFigures(**{**data, "oneshot": tuple(data["oneshot"])})


def job_state(cluster: LocalSlurm, job: int) -> str:
    return cluster.run(["squeue", "-h", "-j", str(job), "-o", "%T"]).stdout.strip() or "GONE"


def test_an_own_drain_is_reserved_rebooted_validated_and_resumed(
    make_slurm: Callable[..., LocalSlurm], public_tmp: Path
) -> None:
    users("ssv-ga", "ssv-gb")
    cluster = make_slurm(3, reboot=True)
    target = cluster.nodes[0]
    (held,) = running_nodes(cluster, sbatch(cluster, "ssv-ga", f"--nodelist={target}", "--wrap", "sleep 600"))
    with GuardProcess(cluster, public_tmp / "guard") as guard:

        def ask(user: str, *args: str) -> str:
            done = cli_as(cluster, user, "guard", *args, "--socket", str(guard.socket))
            return (done.stdout + done.stderr).strip()

        assert "granted (own-job" in ask("ssv-ga", "drain", held, "--run", "llm", "--cause", "XID 79 on GPU 0")
        cluster.run(["scancel", "--user=ssv-ga"], check=True)  # the XID ended the job
        assert "refused (not-own-remedy)" in ask("ssv-gb", "reserve", held, "--run", "other")
        assert "refused (not-own-remedy)" in ask("ssv-ga", "reboot", held, "--run", "llm", "--cause", "XID 79")
        assert "granted (own-remedy" in ask("ssv-ga", "reserve", held, "--run", "llm")
        shown = cluster.run(["scontrol", "-o", "show", "reservation", f"ssv-maint-{held}"], check=True).stdout
        assert "Users=ssv-ga" in shown and "MAINT" in shown, shown
        before = boot_time(cluster, held)
        assert "granted (own-remedy" in ask("ssv-ga", "reboot", held, "--run", "llm", "--cause", "XID 79 on GPU 0")
        cluster.wait_for(lambda: [n for n, _ in cluster.reboots] == [held], 30, message="the reboot")
        try:
            cluster.wait_for(
                lambda: not node(cluster, held).drained and node(cluster, held).responding, 60, message="up"
            )
        except TimeoutError:
            shown = cluster.run(["scontrol", "-o", "show", "node", held]).stdout
            raise AssertionError(f"{held} not back: {shown}\n{cluster.log_tails()}") from None
        assert boot_time(cluster, held) > before  # a reboot, as slurmctld counts one

        others = sbatch(cluster, "ssv-gb", f"--nodelist={held}", "--wrap", "true")  # kept off by the reservation
        outputs = public_tmp / "out"
        outputs.mkdir()
        os.chown(outputs, local_user("ssv-ga").pw_uid, -1)
        check = validation_job(cluster, "ssv-ga", held, outputs / "validation.json")
        cluster.wait_for(lambda: job_state(cluster, check) == "GONE", 180, message="the validation job done")
        assert job_state(cluster, others) == "PENDING"
        measured = figures(outputs / "validation.json")
        assert measured.node == held and measured.burn and measured.collective_gbps and measured.peers_gbps
        lenient = ValidationSettings(burn_min_share=0.05, collective_min_share=0.05)  # 2 shared cores
        assert judge(measured, lenient).passed, (judge(measured, lenient).reasons, measured)
        assert "refused (not-own-remedy)" in ask("ssv-gb", "resume", held)
        assert "granted (own-remedy" in ask("ssv-ga", "resume", held)
        cluster.wait_for(lambda: job_state(cluster, others) == "GONE", 30, message="the other user's job run")
        assert cluster.run(["scontrol", "show", "reservation"]).stdout.strip() == "No reservations in the system"
    rules = [(a["user"], a["op"], a["granted"], a["rule"]) for a in guard.audit()]
    assert rules == [
        ("ssv-ga", "DRAIN", True, "own-job"),
        ("ssv-gb", "RESERVE", False, "not-own-remedy"),
        ("ssv-ga", "REBOOT", False, "not-own-remedy"),
        ("ssv-ga", "RESERVE", True, "own-remedy"),
        ("ssv-ga", "REBOOT", True, "own-remedy"),
        ("ssv-ga", "RESUME", True, "own-remedy"),
        ("ssv-gb", "RESUME", False, "not-own-remedy"),  # bob's second refusal by that rule, folded
    ]
