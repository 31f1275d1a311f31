"""Regenerate the golden Slurm fixtures in this folder from a real private cluster, for the release
it runs (``squeue --version``: 22.05 writes ``*_2205_*``, 24.11 ``*_2411_*``, 26.05 ``*_2605_*``).

Run as root where LocalSlurm works: on the host for its own Slurm, and for another release in that
release's root of the matrix (docs/slurm-releases.md):

    .venv/bin/python tests/data/slurm/capture.py                                   # the host's
    scripts/slurm-release shell 24.11 /opt/ssv-venv/bin/python tests/data/slurm/capture.py

Takes about 40 s. Jobs are named after what they show; the parser tests find them by name. Besides
the raw ``squeue --json`` / ``sinfo --json`` (Slurm's defaults: 24.05+ leaves finished jobs out),
each situation keeps what the adapter reads: every job in every state with the pinned data_parser
(``squeue_<rel>_<situation>_states_all.json``), each of them by id in the formatted form
(``squeue_<rel>_<situation>_by_id.txt``, with the fixed separators ``CAPTURE_SEPARATORS``) and the
JSON node read with NodeAddr (``sinfo_<rel>_<situation>_nodeaddr.json``).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from supervisor.adapters.slurm import squeue_format as fmt
from supervisor.adapters.slurm.reads import sinfo_json_argv, squeue_json_argv
from supervisor.adapters.slurm.release import SlurmRelease, parse_version
from supervisor.testing import LocalSlurm

HERE = Path(__file__).resolve().parent
CAPTURE_SEPARATORS = fmt.Separators("\x1fCAPTURE\x1f", "\x1eCAPTURE\x1e")
RELEASE = ""  # "2205", "2411", "2605": set from the running Slurm in main()


def save(cluster: LocalSlurm, command: str, name: str) -> None:
    name = name.replace("2205", RELEASE)
    out = cluster.run([command, "--json"], timeout=20).stdout
    (HERE / name).write_text(out)
    print("wrote", name, len(out), "bytes")
    flag = SlurmRelease(parse_version(cluster.run(["squeue", "--version"]).stdout)).json_flag()
    if command == "squeue":  # as the adapter asks: every state, the pinned data_parser
        every = cluster.run(squeue_json_argv(json_flag=flag), timeout=20).stdout
        (HERE / name.replace(".json", "_states_all.json")).write_text(every)
        save_by_id(cluster, every, name.replace(".json", "_by_id.txt"))
    else:
        nodes = cluster.run(sinfo_json_argv(json_flag=flag), timeout=20).stdout
        (HERE / name.replace(".json", "_nodeaddr.json")).write_text(nodes)


def save_by_id(cluster: LocalSlurm, doc: str, name: str) -> None:
    """Each job of the document read by id as the daemon's formatted read asks (epoch times)."""
    try:
        ids = [int(j["job_id"]) for j in json.loads(doc).get("jobs") or ()]
    except (ValueError, KeyError, TypeError):
        ids = []
    text = "".join(
        cluster.run(fmt.squeue_by_id_argv(job, CAPTURE_SEPARATORS), env=fmt.TIME_FORMAT_ENV, timeout=20).stdout
        for job in ids
    )
    (HERE / name).write_text(text)
    print("wrote", name, len(text), "bytes")


def sbatch(cluster: LocalSlurm, name: str, *args: str) -> int:
    argv = ["sbatch", "--parsable", f"--job-name={name}", "--output=/dev/null", *args]
    return int(cluster.run(argv, check=True).stdout.strip().split(";")[0])


def state(cluster: LocalSlurm, job: int) -> str:
    out = cluster.run(["squeue", "-h", "-t", "all", "-j", str(job), "-o", "%T"]).stdout
    return out.strip()


def wait_state(cluster: LocalSlurm, job: int, *states: str, timeout: float = 30.0) -> None:
    cluster.wait_for(lambda: state(cluster, job) in states, timeout, message=f"job {job} {states}")


def mixed(cluster: LocalSlurm) -> None:
    done = sbatch(cluster, "completed", "--wrap", "true")
    failed = sbatch(cluster, "failed_exit3", "--wrap", "exit 3")
    killed = sbatch(cluster, "killed_sig9", "--wrap", "kill -9 $$")
    for job in (done, failed, killed):
        wait_state(cluster, job, "COMPLETED", "FAILED")
    cancelled = sbatch(cluster, "cancelled_running", "--wrap", "sleep 300")
    wait_state(cluster, cancelled, "RUNNING")
    cluster.run(["scancel", str(cancelled)], check=True)
    wait_state(cluster, cancelled, "CANCELLED")
    running = sbatch(
        cluster, "running", "--requeue", "--comment=run=r1,intent=7 tag:x", "--exclude=n4", "--wrap", "sleep 300"
    )
    requeued = sbatch(cluster, "requeued", "--requeue", "--wrap", "sleep 300")
    wait_state(cluster, running, "RUNNING")
    wait_state(cluster, requeued, "RUNNING")
    cluster.run(["scontrol", "requeue", str(requeued)], check=True)
    wait_state(cluster, requeued, "PENDING")
    sbatch(cluster, "held_user", "--hold", "--wrap", "true")
    admin = sbatch(cluster, "held_admin", "--begin=now+1hour", "--wrap", "true")
    cluster.run(["scontrol", "hold", str(admin)], check=True)
    sbatch(cluster, "pending_resources", "--nodes=4", "--wrap", "true")
    time.sleep(1.5)  # let the scheduler give pending_resources its reason
    save(cluster, "squeue", "squeue_2205_mixed.json")
    save(cluster, "sinfo", "sinfo_2205_mixed.json")


def node_fail(cluster: LocalSlurm) -> None:
    cluster.reset()
    job = sbatch(cluster, "two_node_no_requeue", "--nodes=2", "--no-requeue", "--wrap", "sleep 300")
    wait_state(cluster, job, "RUNNING")
    nodes = cluster.run(["squeue", "-h", "-j", str(job), "-o", "%N"]).stdout.strip()
    dead = "n2" if "n2" in nodes or "[1-2]" in nodes else nodes.split(",")[-1]
    cluster.crash_node(dead)
    cluster.run(["scontrol", "update", f"nodename={dead}", "state=down", "reason=supervisor: crashed"], check=True)
    save(cluster, "squeue", "squeue_2205_completing.json")
    wait_state(cluster, job, "NODE_FAIL")
    save(cluster, "squeue", "squeue_2205_node_fail.json")
    cluster.run(
        ["scontrol", "update", f"nodename={dead}", "state=drain", "reason=supervisor: crashed, drained"], check=True
    )
    others = [n for n in cluster.nodes if n != dead]
    cluster.run(
        ["scontrol", "update", f"nodename={others[1]}", "state=drain", "reason=supervisor: test drain"], check=True
    )
    cluster.crash_node(others[2])
    cluster.wait_for(lambda: cluster.node_states()[others[2]].endswith("*"), 30, message="NOT_RESPONDING")
    save(cluster, "sinfo", "sinfo_2205_down_drain.json")


def controller_down(cluster: LocalSlurm) -> None:
    cluster.stop_controller()
    save(cluster, "squeue", "squeue_2205_controller_down.json")
    save(cluster, "sinfo", "sinfo_2205_controller_down.json")


def prolog_failure() -> None:
    with LocalSlurm(2, extra_conf={"Prolog": "/bin/false"}) as cluster:
        job = sbatch(cluster, "prolog_failed", "--requeue", "--wrap", "true")
        cluster.wait_for(
            lambda: "launch failed" in cluster.run(["squeue", "-h", "-j", str(job), "-o", "%r"]).stdout,
            30,
            message="held after prolog",
        )
        save(cluster, "squeue", "squeue_2205_prolog_held.json")
        save(cluster, "sinfo", "sinfo_2205_prolog_drain.json")


def main() -> int:
    global RELEASE
    with LocalSlurm(4) as cluster:
        version = parse_version(cluster.run(["squeue", "--version"], check=True).stdout)
        assert version is not None
        RELEASE = f"{version[0]:02d}{version[1]:02d}"
        mixed(cluster)
        node_fail(cluster)
        controller_down(cluster)
    prolog_failure()
    return 0


if __name__ == "__main__":
    sys.exit(main())
