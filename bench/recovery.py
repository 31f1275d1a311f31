"""Recovery time after a node crash: the supervisor versus Slurm alone, on the same real cluster.

A private Slurm 22.05 (LocalSlurm, 4 nodes, SlurmdTimeout=10, cred_expire=10) runs a 2-node job
whose batch script runs ``srun sleep``. Once the job and its step run (and, with the supervisor,
the daemon reports the run running), and after a random wait of 0 to one poll interval (so the
crash falls anywhere in the daemon's tick cycle), the job's batch host is crashed
(``LocalSlurm.crash_node``: slurmd and every job process on the node get SIGKILL at once) and the
clock starts (t0). Recovery ends (t1) when the job, or the run's replacement job, is RUNNING on
two nodes none of which is the crashed one. Polled with ``squeue`` every 0.1 s.

* supervisor: the real daemon (``slurm-supervisor --config X daemon``) supervises a run registered
  with ``slurm-supervisor submit RUN.toml`` (2 nodes, one named spare, restart.mode = resubmit).
  Its jobs are found by their comment ``slurm-supervisor:RUN:...``.
* slurm alone: ``sbatch --requeue -N2`` (JobRequeue=1), no supervisor; the same job id must run
  again.
* in-allocation (with ``--mode in-allocation``): the same daemon, the run registered with
  ``[restart] mode = "in-allocation"`` and ``hot_spares = 1`` (a ``--no-kill`` job on 3 nodes), its
  batch script ``slurm-supervisor launch -- sleep``; the crashed node is the step's node that is not
  the batch host (the batch host's death falls back to resubmission), and recovery ends when a
  new step of the *same* job runs on two nodes none of which is the crashed one.

Trials alternate (supervisor, Slurm alone, supervisor, ...). Between trials the daemon is stopped
(SIGTERM), jobs are cancelled, the crashed node is restarted and every node is idle again
(``LocalSlurm.reset``); each supervisor trial has a fresh state directory.

Usage: .venv/bin/python bench/recovery.py [--trials 3] [--poll-interval 5.0]
                                          [--scheduler harness|slurm-default|both]
                                          [--mode resubmit|in-allocation]
The last line of stdout is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import hostlist  # type: ignore[import-untyped]

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    TAG_PREFIX,
    DaemonProc,
    Job,
    fmt_s,
    jobs,
    median,
    quiet_logs,
    run_on_release,
    slurm_version,
    start_daemon,
    steps_running,
    supervisor_cli,
    table,
    wait_for,
    write_daemon_config,
    write_run_spec,
    write_script,
)

from supervisor.adapters.slurm.release import SlurmRelease, parse_version  # noqa: E402
from supervisor.testing import LocalSlurm  # noqa: E402

RUN_NODES = 2
POLL_S = 0.1
RECOVERY_TIMEOUT_S = 150.0
# LocalSlurm's default is bf_interval=1 (a test setting); Slurm's own default is bf_interval=30.
SCHEDULERS = {
    "harness": None,  # LocalSlurm's slurm.conf as the tests use it
    "slurm-default": {"SchedulerParameters": "bf_interval=30"},  # Slurm's default backfill interval
}
PAYLOAD = "srun sleep 100000\n"
LAUNCHED = f"exec {sys.executable} -m supervisor launch -- sleep 100000\n"  # in-allocation: the launcher
IN_ALLOCATION = 'mode = "in-allocation"\nhot_spares = 1\n'


@dataclass
class Trial:
    mode: str
    scheduler: str
    n: int
    job_before: int = 0
    nodes_before: tuple[str, ...] = ()
    crashed: str = ""
    phase_s: float = 0.0  # random wait before the crash, so it falls anywhere in a poll interval
    recovery_s: float | None = None
    detected_s: float | None = None  # supervisor: logbook 'fault' event; Slurm alone: node DOWN
    old_job_left_running_s: float | None = None
    replacement_seen_s: float | None = None  # new job id submitted / same id back to PENDING
    job_after: int | None = None
    nodes_after: tuple[str, ...] = ()
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    transitions: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------- watching


def watch_recovery(cluster: LocalSlurm, trial: Trial, t0: float, is_ours, timeout: float) -> None:
    """Poll squeue until one of our jobs runs again without the crashed node; fill ``trial``."""
    deadline = t0 + timeout
    seen: dict[int, str] = {trial.job_before: "RUNNING"}
    while time.monotonic() < deadline:
        snapshot = jobs(cluster)
        now = time.monotonic() - t0
        if snapshot is not None:
            ours = [j for j in snapshot if is_ours(j)]
            old = next((j for j in ours if j.job_id == trial.job_before), None)
            for j in ours:  # state changes of our jobs, for the notes
                if seen.get(j.job_id) != j.state:
                    seen[j.job_id] = j.state
                    trial.transitions.append(f"{now:.2f}s job {j.job_id} {j.state}")
            if trial.old_job_left_running_s is None and (old is None or old.state != "RUNNING"):
                trial.old_job_left_running_s = now
            if trial.replacement_seen_s is None:
                fresh = [j for j in ours if j.job_id != trial.job_before]
                requeued = old is not None and old.state in ("PENDING", "REQUEUED", "REQUEUE_FED")
                if fresh or requeued:
                    trial.replacement_seen_s = now
            for j in ours:
                if j.state == "RUNNING" and len(j.nodes) == RUN_NODES and trial.crashed not in j.nodes:
                    trial.recovery_s = now
                    trial.job_after, trial.nodes_after = j.job_id, j.nodes
                    return
        if trial.detected_s is None and trial.mode == "slurm alone":
            state = cluster.node_states().get(trial.crashed, "")
            if state.startswith("down"):
                trial.detected_s = time.monotonic() - t0
        time.sleep(POLL_S)
    trial.error = f"not running again within {timeout:.0f} s"


def watch_swap(cluster: LocalSlurm, trial: Trial, t0: float, timeout: float) -> None:
    """In-allocation: poll the job's steps until a step runs on two nodes without the crashed one."""
    deadline = t0 + timeout
    while time.monotonic() < deadline:
        for step_id, nodes in job_steps(cluster, trial.job_before):
            if len(nodes) == RUN_NODES and trial.crashed not in nodes:
                trial.recovery_s = time.monotonic() - t0
                trial.job_after, trial.nodes_after = trial.job_before, nodes
                trial.transitions.append(f"{trial.recovery_s:.2f}s step {step_id} on {','.join(nodes)}")
                return
        time.sleep(POLL_S)
    trial.error = f"no step on the survivor and the spare within {timeout:.0f} s"


def job_steps(cluster: LocalSlurm, job_id: int) -> list[tuple[str, tuple[str, ...]]]:
    """The job's running steps other than the batch step: (step id, nodes)."""
    result = cluster.run(["squeue", "-h", "-s", "-j", str(job_id), "-o", "%i %N"], timeout=15)
    out = []
    for line in result.stdout.splitlines() if result.returncode == 0 else ():
        step, _, nodes = line.strip().partition(" ")
        if step.split(".", 1)[-1].isdigit() and nodes:
            out.append((step, tuple(hostlist.expand_hostlist(nodes))))
    return out


def wait_running(cluster: LocalSlurm, is_ours, what: str, size: int = RUN_NODES) -> Job:
    def ready() -> Job | None:
        snapshot = jobs(cluster) or []
        for j in snapshot:
            if is_ours(j) and j.state == "RUNNING" and len(j.nodes) == size:
                return j
        return None

    job = wait_for(ready, 60, f"{what} RUNNING")
    wait_for(lambda: steps_running(cluster, job.job_id), 30, f"job {job.job_id}'s srun step running")
    return job


# ---------------------------------------------------------------------------- trials


def supervisor_trial(cluster: LocalSlurm, work: Path, trial: Trial, poll_interval: float) -> None:
    in_allocation = trial.mode == "in-allocation"
    d = work / f"{trial.mode}-{trial.scheduler}-{trial.n}"
    (d / "state").mkdir(parents=True)
    (d / "out").mkdir()
    run = f"bench-{trial.mode}-{trial.scheduler}-{trial.n}"
    script = write_script(d / "train.sh", LAUNCHED if in_allocation else PAYLOAD)
    spec = write_run_spec(
        d / "run.toml",
        name=run,
        script=script,
        partition=cluster.partition,
        nodes=RUN_NODES,
        output=d / "out" / "%x-%j.out",
        spares=None if in_allocation else cluster.nodes[-1],
    )
    if in_allocation:  # [restart] is the spec's last section
        spec.write_text(spec.read_text() + IN_ALLOCATION)
    config = write_daemon_config(
        d / "supervisor.toml",
        cluster,
        d / "state",
        poll_interval_s=poll_interval,
        probe_timeout_s=1.0,
        confirm_after_s=1.0,
    )
    tag = f"{TAG_PREFIX}:{run}:"

    def is_ours(j: Job) -> bool:
        return j.comment.startswith(tag)

    daemon: DaemonProc = start_daemon(config, cluster, d / "daemon.log")
    try:
        supervisor_cli(config, cluster, "submit", str(spec))
        job = wait_running(cluster, is_ours, f"run {run}'s job", RUN_NODES + int(in_allocation))

        def daemon_sees_running() -> bool:
            if not daemon.alive():
                raise RuntimeError(f"daemon exited ({daemon.proc.returncode}):\n{daemon.log_tail()}")
            status = json.loads(supervisor_cli(config, cluster, "status", "--json"))
            return bool(status) and status[0]["state"] == "running" and status[0]["job_id"] == job.job_id

        wait_for(daemon_sees_running, 30, "daemon reports the run running", interval=0.3)
        time.sleep(trial.phase_s)
        trial.job_before, trial.nodes_before, trial.crashed = job.job_id, job.nodes, job.batch_host
        if in_allocation:  # the step's other node (the step runs on the first two, the batch host first)
            trial.crashed = next(n for n in job.nodes[:RUN_NODES] if n != job.batch_host)
        cluster.crash_node(trial.crashed)
        t0, t0_wall = time.monotonic(), time.time()
        if in_allocation:
            watch_swap(cluster, trial, t0, RECOVERY_TIMEOUT_S)
        else:
            watch_recovery(cluster, trial, t0, is_ours, RECOVERY_TIMEOUT_S)
        events = [
            json.loads(line)
            for line in supervisor_cli(config, cluster, "logbook", run, "--json").splitlines()
            if line.strip()
        ]
        fault = next((e for e in events if e["kind"] == "fault"), None)
        if fault is not None:
            trial.detected_s = fault["at"] - t0_wall
            trial.notes.append(f"fault: {fault['message']}")
        restarted = next((e for e in events if e["kind"] == "restarted"), None)
        if restarted is not None:
            trial.notes.append(f"restart: {restarted['message']}")
        swapped = next((e for e in events if e["message"].startswith("swap in job")), None)
        if swapped is not None:
            trial.notes.append(f"swap: {swapped['message']}")
        if not daemon.alive():
            trial.notes.append(f"daemon exited early ({daemon.proc.returncode})")
    finally:
        early = not daemon.alive()
        rc = daemon.stop()
        if rc not in (0, None) or early:
            trial.notes.append(
                f"daemon exit status {rc}{' before it was stopped' if early else ''}; "
                f"its log ends:\n{daemon.log_tail(40)}"
            )


def cluster_conf(sched: str) -> dict[str, str]:
    """The scheduler's settings; where the release has expedited requeue, switched on as a site that
    wants it would (SlurmctldParameters=enable_expedited_requeue: without it sbatch refuses
    --requeue=expedite, "Expedited requeue requested but not enabled")."""
    conf = dict(SCHEDULERS[sched] or {})
    # slurmctld -V needs no slurm.conf (squeue --version does on 24.11+, and there is none yet)
    slurmctld = shutil.which("slurmctld", path="/usr/sbin:/usr/bin:" + os.environ.get("PATH", "")) or "slurmctld"
    out = subprocess.run([slurmctld, "-V"], capture_output=True, text=True, check=False).stdout
    if SlurmRelease(parse_version(out)).expedited_requeue:
        conf["SlurmctldParameters"] = "enable_expedited_requeue"
    return conf


SLURM_SEEN: dict[str, str] = {}  # the release measured and the baseline's requeue option, for the JSON line


@functools.cache
def requeue_option(cluster: LocalSlurm) -> str:
    """Slurm alone at its best: --requeue=expedite where the release has it (25.11+: the requeued job
    starts at once, first in the queue, its other nodes kept for it), plain --requeue before."""
    release = SlurmRelease(parse_version(slurm_version(cluster)))
    return "--requeue=expedite" if release.expedited_requeue else "--requeue"


def slurm_alone_trial(cluster: LocalSlurm, work: Path, trial: Trial) -> None:
    d = work / f"alone-{trial.scheduler}-{trial.n}"
    (d / "out").mkdir(parents=True)
    script = write_script(d / "train.sh", PAYLOAD)
    name = f"alone-{trial.scheduler}-{trial.n}"
    out = cluster.run(
        [
            "sbatch",
            "--parsable",
            f"--job-name={name}",
            f"--partition={cluster.partition}",
            f"--nodes={RUN_NODES}",
            requeue_option(cluster),
            f"--output={d / 'out' / '%x-%j.out'}",
            "--open-mode=append",
            f"--chdir={d}",
            str(script),
        ],
        check=True,
    ).stdout
    job_id = int(out.strip().split(";")[0])

    def is_ours(j: Job) -> bool:
        return j.job_id == job_id

    job = wait_running(cluster, is_ours, f"job {job_id}")
    time.sleep(trial.phase_s)
    trial.job_before, trial.nodes_before, trial.crashed = job.job_id, job.nodes, job.batch_host
    cluster.crash_node(trial.crashed)
    t0 = time.monotonic()
    watch_recovery(cluster, trial, t0, is_ours, RECOVERY_TIMEOUT_S)


def run_trial(cluster: LocalSlurm, work: Path, trial: Trial, poll_interval: float) -> None:
    cluster.reset(timeout=90)
    try:
        if trial.mode in ("supervisor", "in-allocation"):
            supervisor_trial(cluster, work, trial, poll_interval)
        else:
            slurm_alone_trial(cluster, work, trial)
    except Exception as exc:  # noqa: BLE001 - a failed trial is reported, the others still run
        trial.error = f"{type(exc).__name__}: {exc}"
    finally:
        cluster.reset(timeout=90)


# ---------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3, help="trials per mode (default 3)")
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=5.0,
        help="daemon.poll_interval_s for the supervisor (default 5.0, the daemon's default)",
    )
    parser.add_argument(
        "--scheduler",
        choices=[*SCHEDULERS, "both"],
        default="harness",
        help="harness: LocalSlurm's slurm.conf (bf_interval=1, a test setting); "
        "slurm-default: Slurm's default bf_interval=30; both: one cluster each",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=1,
        help="seed of the random wait (0 to one poll interval) before each crash (default 1)",
    )
    parser.add_argument(
        "--mode",
        choices=["resubmit", "in-allocation"],
        default="resubmit",
        help="in-allocation: also run in-allocation trials (a hot spare swapped into the same job)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work and cluster directories")
    parser.add_argument("--slurm-release", help="run on this release of the matrix (22.05, 24.11, 26.05)")
    args = parser.parse_args()
    run_on_release(args.slurm_release)
    quiet_logs()

    schedulers = list(SCHEDULERS) if args.scheduler == "both" else [args.scheduler]
    modes = ("supervisor", "slurm alone") + (("in-allocation",) if args.mode == "in-allocation" else ())
    work = Path(tempfile.mkdtemp(prefix="ssv-recovery-"))
    work.chmod(0o755)
    trials: list[Trial] = []
    rng = random.Random(args.seed)
    started = time.monotonic()
    try:
        for sched in schedulers:
            with LocalSlurm(4, extra_conf=cluster_conf(sched), keep_dir=args.keep) as cluster:
                SLURM_SEEN.update(version=slurm_version(cluster), requeue=requeue_option(cluster))
                print(
                    f"# cluster ({sched}): {len(cluster.nodes)} nodes, SlurmdTimeout=10, cred_expire=10, "
                    f"SchedulerParameters={_sched_params(cluster)}; conf {cluster.slurm_conf}",
                    flush=True,
                )
                for n in range(1, args.trials + 1):
                    for mode in modes:
                        trial = Trial(mode, sched, n, phase_s=rng.uniform(0.0, args.poll_interval))
                        run_trial(cluster, work, trial, args.poll_interval)
                        trials.append(trial)
                        print(
                            f"#   {sched} {mode} trial {n}: recovery {fmt_s(trial.recovery_s)} s"
                            + (f"  ERROR {trial.error}" if trial.error else ""),
                            flush=True,
                        )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    wall = time.monotonic() - started

    rows = [
        (
            t.scheduler,
            t.mode,
            t.n,
            t.job_before,
            ",".join(t.nodes_before),
            t.crashed,
            f"{t.phase_s:.2f}",
            fmt_s(t.detected_s),
            fmt_s(t.old_job_left_running_s),
            fmt_s(t.replacement_seen_s),
            fmt_s(t.recovery_s),
            t.job_after,
            ",".join(t.nodes_after),
            t.error or "",
        )
        for t in trials
    ]
    print()
    print(
        table(
            rows,
            [
                "sched",
                "mode",
                "trial",
                "job",
                "nodes",
                "crashed",
                "wait_s",
                "detected_s",
                "old_off_s",
                "new/requeued_s",
                "RECOVERY_s",
                "job_after",
                "nodes_after",
                "error",
            ],
        )
    )
    print(
        "\nwait_s: random wait (0 to one poll interval) between the steady state and the crash, so that the\n"
        "crash falls at a random point of the daemon's tick cycle (Slurm alone trials wait likewise)."
    )
    print("detected_s: supervisor = logbook 'fault' event; Slurm alone = node DOWN in sinfo.")
    print(
        "old_off_s: the crashed job left RUNNING; new/requeued_s: a replacement job id appeared "
        "(supervisor) or the job went back to PENDING (Slurm alone)."
    )
    for t in trials:
        if t.transitions:
            print(f"  {t.scheduler} {t.mode} #{t.n}: squeue after the crash: {'; '.join(t.transitions)}")
        for note in t.notes:
            print(f"  {t.scheduler} {t.mode} #{t.n}: {note}")

    figures: dict[str, object] = {}
    for sched in schedulers:
        sup = [t.recovery_s for t in trials if t.scheduler == sched and t.mode == "supervisor" and t.recovery_s]
        alone = [t.recovery_s for t in trials if t.scheduler == sched and t.mode == "slurm alone" and t.recovery_s]
        m_sup, m_alone = median(sup), median(alone)
        figures[sched] = {
            "supervisor_s": _r(m_sup),
            "slurm_alone_s": _r(m_alone),
            "ratio": _r(m_sup / m_alone) if m_sup and m_alone else None,
            "supervisor_trials_s": [_r(x) for x in sup],
            "slurm_alone_trials_s": [_r(x) for x in alone],
        }
        if args.mode == "in-allocation":
            inalloc = [
                t.recovery_s for t in trials if t.scheduler == sched and t.mode == "in-allocation" and t.recovery_s
            ]
            m_in = median(inalloc)
            figures[sched]["in_allocation_s"] = _r(m_in)
            figures[sched]["in_allocation_ratio"] = _r(m_in / m_alone) if m_in and m_alone else None
            figures[sched]["in_allocation_trials_s"] = [_r(x) for x in inalloc]
    headline = figures[schedulers[0]]
    failed = sum(1 for t in trials if t.error)
    print()
    for sched, f in figures.items():
        print(
            f"{sched}: supervisor median {f['supervisor_s']} s, Slurm alone median {f['slurm_alone_s']} s, "
            f"ratio {f['ratio']} (goal <= 0.5)"
        )
        if "in_allocation_s" in f:
            print(
                f"{sched}: in-allocation median {f['in_allocation_s']} s, ratio {f['in_allocation_ratio']} (goal <= 0.1)"
            )
    result = {
        "supervisor_s": headline["supervisor_s"],
        "slurm_alone_s": headline["slurm_alone_s"],
        "ratio": headline["ratio"],
        **{k: headline[k] for k in ("in_allocation_s", "in_allocation_ratio") if k in headline},
        "mode": args.mode,
        "slurm": SLURM_SEEN.get("version"),
        "slurm_alone_requeue": SLURM_SEEN.get("requeue"),
        "trials": args.trials,
        "scheduler": schedulers[0],
        "poll_interval_s": args.poll_interval,
        "seed": args.seed,
        "failed_trials": failed,
        "by_scheduler": figures,
        "wall_s": round(wall, 1),
    }
    print(json.dumps(result))
    return 1 if failed else 0


def _sched_params(cluster: LocalSlurm) -> str:
    for line in cluster.slurm_conf.read_text().splitlines():
        if line.startswith("SchedulerParameters="):
            return line.split("=", 1)[1]
    return "(Slurm default)"


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


if __name__ == "__main__":
    sys.exit(main())
