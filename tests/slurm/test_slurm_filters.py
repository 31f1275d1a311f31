"""Which filters Slurm honours, and the daemon's scoped reads (issue 14), on a real private Slurm.

Two local users submit jobs; the adapter scoped to one of them must see that user's jobs only —
with the same values the unfiltered ``--json`` read gives for them — and the nodes asked for.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace

import pytest

from supervisor.adapters.slurm.cli import SlurmCli
from supervisor.adapters.slurm.release import JSON_FILTERS_FROM, parse_version
from supervisor.domain.cluster import JobState
from supervisor.testing import LocalSlurm
from supervisor.testing.slurm.users import UsersUnavailable, as_user, local_user

pytestmark = pytest.mark.slurm

ALICE, BOB = "ssv-flt-alice", "ssv-flt-bob"
# separators, a tab, a newline-free but hostile text: what a delimiter-naive parser would split on
ODD = "a|b,c;d\te\x1fg \\ (null)"


@pytest.fixture(scope="module")
def users() -> tuple[str, str]:
    try:
        for name in (ALICE, BOB):
            local_user(name)
    except UsersUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI runs as root and must make test accounts: {exc}")
        pytest.skip(str(exc))
    return ALICE, BOB


def sbatch(cluster: LocalSlurm, user: str, *args: str) -> int:
    done = as_user(user, ["sbatch", "--parsable", "-N1", *args], env=cluster.env, cwd="/tmp")
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip().split(";")[0])


def cli(cluster: LocalSlurm, user: str | None = None) -> SlurmCli:
    return SlurmCli(slurm_conf=str(cluster.slurm_conf), env=cluster.env, user=user)


def version(cluster: LocalSlurm) -> tuple[int, int]:
    found = parse_version(cluster.run(["squeue", "--version"], check=True).stdout)
    assert found is not None
    return found


def test_json_of_2205_ignores_every_filter(slurm_cluster, users):
    """The measured fact the scoped reads rest on (bench/README.md): 22.05's --json prints every
    job and every node whatever the filters say."""
    if version(slurm_cluster) >= JSON_FILTERS_FROM:
        pytest.skip("this Slurm's --json honours filters")
    mine = sbatch(slurm_cluster, ALICE, "--hold", "--wrap", "sleep 60")
    theirs = sbatch(slurm_cluster, BOB, "--hold", "--wrap", "sleep 60")
    for argv in (["--user", ALICE], ["--jobs", str(mine)], ["--states", "RUNNING"]):
        doc = json.loads(slurm_cluster.run(["squeue", "--json", *argv], check=True).stdout)
        assert {mine, theirs} <= {j["job_id"] for j in doc["jobs"]}, argv
    doc = json.loads(slurm_cluster.run(["sinfo", "--json", "--nodes", "n1"], check=True).stdout)
    assert {n["name"] for n in doc["nodes"]} == set(slurm_cluster.nodes)


def test_scoped_snapshot_holds_only_the_users_jobs_with_the_json_values(slurm_cluster, users):
    held = sbatch(slurm_cluster, ALICE, "--hold", f"--comment={ODD}", f"--job-name={ODD}", "--wrap", "sleep 60")
    running = sbatch(slurm_cluster, ALICE, "--output=/tmp/ssv-flt-%j.out", "--wrap", "sleep 60")
    failed = sbatch(slurm_cluster, ALICE, "--output=/dev/null", "--wrap", "exit 3")
    theirs = sbatch(slurm_cluster, BOB, "--hold", "--wrap", "sleep 60")
    everyone = cli(slurm_cluster)

    def settled():
        jobs = everyone.snapshot(include_nodes=False).jobs
        return jobs if jobs[running].state is JobState.RUNNING and jobs[failed].state.finished else None

    all_jobs = slurm_cluster.wait_for(settled, 30, message="one job running, one failed")
    scoped = cli(slurm_cluster, ALICE).snapshot(include_nodes=False).jobs
    assert theirs not in scoped and {held, running, failed} <= set(scoped)
    assert {j.user_id for j in scoped.values()} == {all_jobs[held].user_id}
    for job_id in (held, running, failed):
        json_job, text_job = all_jobs[job_id], scoped[job_id]
        if not json_job.stdout:  # 22.05's JSON leaves the default path out; squeue -O resolves it
            assert text_job.stdout == f"/tmp/slurm-{job_id}.out"
            text_job = replace(text_job, stdout="")
        assert text_job == json_job, job_id  # the same JobInfo through either reading
    assert scoped[held].comment == ODD and scoped[held].name == ODD and scoped[held].held
    assert scoped[failed].exit_code == 3 and scoped[failed].state is JobState.FAILED


def test_scoped_node_reads_return_the_nodes_asked_for_with_the_json_values(slurm_cluster, users):
    reason = f"maintenance {ODD}"
    slurm_cluster.run(["scontrol", "update", "nodename=n2", "state=drain", f"reason={reason}"], check=True)
    everyone = cli(slurm_cluster).snapshot().nodes
    scoped = cli(slurm_cluster, ALICE)
    assert set(scoped.snapshot(include_nodes=frozenset({"n2", "n3"})).nodes) == {"n2", "n3"}
    assert scoped.snapshot(include_nodes=frozenset()).nodes == {}
    named = scoped.snapshot(include_nodes=frozenset(slurm_cluster.nodes)).nodes
    assert named == everyone
    whole = scoped.snapshot(include_nodes=True).nodes
    if version(slurm_cluster) >= JSON_FILTERS_FROM:  # filtered JSON, one entry per node: addresses too
        assert whole == everyone and {i.address for i in whole.values()} == {"127.0.0.1"}
    else:  # 22.05's formatted whole read is grouped by sinfo: no per-node address or port
        assert whole == {n: replace(i, address="", port=None) for n, i in everyone.items()}
    assert whole["n2"].drained and whole["n2"].reason == reason


def _job_rpcs(cluster: LocalSlurm) -> dict[str, int]:
    out = cluster.run(["sdiag"], check=True).stdout
    return {m[1]: int(m[2]) for m in re.finditer(r"^\s*(REQUEST_JOB\w*)\s+\(\s*\d+\)\s+count:(\d+)", out, re.M)}


def test_jobs_read_by_id_are_single_job_lookups_or_the_accounts_filtered_list(slurm_cluster, users):
    """Where the account's list is every job (root's), each named job is read by its id: slurmctld
    looks up that job alone (REQUEST_JOB_INFO_SINGLE) instead of packing every job in the cluster,
    and a job it no longer holds is absent, not an error. Another account's several jobs come from
    its one list, which slurmctld filters (REQUEST_JOB_USER_INFO)."""
    held = sbatch(slurm_cluster, ALICE, "--hold", f"--comment={ODD}", "--wrap", "sleep 60")
    other = sbatch(slurm_cluster, ALICE, "--hold", "--wrap", "sleep 60")
    account = cli(slurm_cluster, ALICE).snapshot(include_nodes=False).jobs
    for user, rpc, calls in (("root", "REQUEST_JOB_INFO_SINGLE", 3), (ALICE, "REQUEST_JOB_USER_INFO", 1)):
        reader = cli(slurm_cluster, user)
        slurm_cluster.run(["sdiag", "--reset"], check=True)
        by_id = reader.snapshot_of({held, other, 99_999_999}, include_nodes=False).jobs
        assert by_id == {held: account[held], other: account[other]}, user
        rpcs = _job_rpcs(slurm_cluster)
        assert rpcs.get(rpc) == calls and "REQUEST_JOB_INFO" not in rpcs, (user, rpcs)
