"""Tenants who share a cluster (issue 32, findings 1 and 2), on a real Slurm with two accounts.

One cluster of three 2-CPU nodes (``cons_tres``, ``CR_CPU``: a node is shared unless a job asks
``--exclusive``), the guard as root, ``ssv-ga`` (Bob) and ``ssv-gb`` (Mallory) as the tenants.

* Finding 1: Mallory puts a 1-CPU job next to Bob's on Bob's node and asks the guard, as herself,
  to DOWN it. Before the fix the guard granted it (``own-job``: *a* job of hers was there) and
  Slurm killed Bob's job. Now it is refused (``shared-node``) and Bob's job keeps running.
* Finding 2: Mallory, on nodes of her own job, asks again and again under new run names, and past
  a cluster-wide cap of 1. Before the fix every name was a new fault (24 h doubling per name) and
  the capped node was quarantined too. Now one fault per account and node, only for a grant.

Both in one test: one cluster start (a few seconds) serves both attacks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from test_guard_slurm import GuardProcess, cli_as, public_tmp, running_nodes, slurm, user_env, users

from supervisor.domain.cluster import JobState
from supervisor.testing import LocalSlurm
from supervisor.testing.slurm.users import as_user

pytestmark = pytest.mark.slurm
__all__ = ["public_tmp"]  # a fixture, used here

BOB, MALLORY = "ssv-ga", "ssv-gb"
DAY = 86400.0


def sbatch(cluster: LocalSlurm, user: str, *args: str) -> int:
    argv = ["sbatch", "--parsable", "--output=/dev/null", *args, "--wrap", "sleep 600"]
    done = as_user(user, argv, env=user_env(cluster, user), cwd="/tmp")
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


def test_a_tenant_can_neither_kill_a_shared_node_nor_poison_the_quarantine(
    make_slurm: Callable[..., LocalSlurm], public_tmp: Path
) -> None:
    users(BOB, MALLORY)
    cluster = make_slurm(3, cpus_per_node=2)
    bobs_job = sbatch(cluster, BOB, "-N1", "-n1")
    (shared,) = running_nodes(cluster, bobs_job)
    mallorys_small = sbatch(cluster, MALLORY, "-N1", "-n1", f"--nodelist={shared}")
    assert running_nodes(cluster, mallorys_small) == (shared,)
    mallorys_own = sbatch(cluster, MALLORY, "-N2", "--exclusive")
    own = running_nodes(cluster, mallorys_own)
    with GuardProcess(cluster, public_tmp / "guard", max_drains=1) as guard:

        def ask(user: str, target: str, run: str, *flags: str):
            argv = ["guard", "drain", target, "--run", run, "--cause", "XID 79", "--socket", str(guard.socket)]
            return cli_as(cluster, user, *argv, *flags)

        # Finding 1: a DOWN of the shared node, asked by the tenant with the small job there.
        killed = ask(MALLORY, shared, "mine", "--down")
        assert killed.returncode == 1 and "refused (shared-node)" in killed.stderr, killed.stdout + killed.stderr
        assert "refused (shared-node)" in ask(MALLORY, shared, "mine").stderr  # a DRAIN neither
        bob = slurm(cluster).snapshot(include_nodes=False).jobs[bobs_job]
        assert bob.state is JobState.RUNNING and not slurm(cluster).snapshot().nodes[shared].drained

        # Finding 2: six run names for one node of her own, then a second node past the cap.
        for name in ("r0", "r1", "r2", "r3", "r4", "r5"):
            assert ask(MALLORY, own[0], name).returncode == 0
        capped = ask(MALLORY, own[1], "r6")
        assert "refused (cluster-cap)" in capped.stderr, capped.stdout + capped.stderr
        held = GuardProcess.client(guard).quarantined()
    assert set(held) == {own[0]}, held  # the capped node was not taken out: it is no fault
    (fault,) = held[own[0]].faults
    assert fault.run.startswith(f"{MALLORY}/")
    assert held[own[0]].until - held[own[0]].since == pytest.approx(DAY)  # base_h, not 2**5 days
