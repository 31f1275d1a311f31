"""Load the supervisor puts on slurmctld: controller RPCs per reconcile tick, with 1 and 20 runs.

The real daemon runs as its own Unix user (``ssvbench``, created when missing), so slurmctld's
``sdiag`` "RPC statistics by user" separate its RPCs from everyone else's (the benchmark's own
Slurm calls run as root; slurmd's messages come from root too). The jobs run as that user as
well, so their batch script is a plain ``sleep`` that makes no RPC (an ``srun`` in the job would
count as the supervisor's).

For N in (1, 20) on one private cluster (LocalSlurm, 22 one-CPU nodes):
  1. start the daemon (poll_interval_s = 1.0, probe enabled, log level debug, JSON logs),
     register N one-node runs with ``slurm-supervisor submit`` (as that user);
  2. wait until every run's job is RUNNING and the daemon reports every run ``running``
     (steady state: nothing left to do), then 2 s more;
  3. ``sdiag -r`` (reset, as root); wait WINDOW seconds, touching nothing; ``sdiag``;
  4. ticks in the window = the daemon's ``squeue`` calls logged in it (at level debug the Slurm
     adapter logs ``slurm.call`` with the argv of every client it runs; each tick starts with
     exactly one ``squeue``). RPCs per tick = the user's RPC count / ticks.

Usage: .venv/bin/python bench/controller_load.py [--window 30] [--runs 1,20] [--user ssvbench]
The last line of stdout is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    TAG_PREFIX,
    DaemonProc,
    jobs,
    quiet_logs,
    run_on_release,
    slurm_version,
    start_daemon,
    supervisor_cli,
    table,
    wait_for,
    write_daemon_config,
    write_run_spec,
    write_script,
)

from supervisor.testing import LocalSlurm  # noqa: E402

NODES = 22
POLL_S = 1.0
SETTLE_S = 2.0
NOT_THE_DAEMON = {"REQUEST_STATS_INFO"}  # the benchmark's closing sdiag (root)
_RPC_LINE = re.compile(r"^\s+(\S+)\s+\(\s*(\d+)\)\s+count:(\d+)\s+ave_time:(\d+)\s+total_time:(\d+)")


@dataclass
class Sdiag:
    by_type: dict[str, int] = field(default_factory=dict)
    by_user: dict[str, int] = field(default_factory=dict)
    user_time_us: dict[str, int] = field(default_factory=dict)


def parse_sdiag(text: str) -> Sdiag:
    out = Sdiag()
    section = None
    for line in text.splitlines():
        if line.startswith("Remote Procedure Call statistics by message type"):
            section = "type"
        elif line.startswith("Remote Procedure Call statistics by user"):
            section = "user"
        elif line and not line[0].isspace():
            section = None
        elif section:
            m = _RPC_LINE.match(line)
            if m:
                name, count, total = m.group(1), int(m.group(3)), int(m.group(5))
                if section == "type":
                    out.by_type[name] = count
                else:
                    out.by_user[name] = count
                    out.user_time_us[name] = total
    return out


def ensure_user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",  # noqa: S603,S607
                "--shell",
                "/usr/sbin/nologin",
                name,
            ],
            check=True,
        )
        print(f"# created system user {name}", flush=True)
        return pwd.getpwnam(name)


def log_time(record: dict) -> float | None:
    stamp = record.get("timestamp")
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass
class Measurement:
    runs: int
    window_s: float = 0.0
    ticks: int = 0
    calls: dict[str, int] = field(default_factory=dict)
    user_rpcs: int = 0
    user_rpc_time_ms: float = 0.0
    other_rpcs: dict[str, int] = field(default_factory=dict)
    by_type: dict[str, int] = field(default_factory=dict)
    still_running: int = 0
    slurmd_log_lines: int = 0

    @property
    def rpcs_per_tick(self) -> float | None:
        return self.user_rpcs / self.ticks if self.ticks else None

    @property
    def client_types(self) -> dict[str, int]:
        """RPC types a client sends (not slurmd's MESSAGE_*), less the closing sdiag's."""
        return {t: c for t, c in self.by_type.items() if t not in NOT_THE_DAEMON and not t.startswith("MESSAGE_")}

    @property
    def types_account_for_user(self) -> bool:
        """Whether the client RPC types add up to the daemon user's count (so they are its RPCs)."""
        return sum(self.client_types.values()) == self.user_rpcs


def measure(cluster: LocalSlurm, work: Path, user: pwd.struct_passwd, runs: int, window: float) -> Measurement:
    cluster.reset(timeout=90)
    d = work / f"runs-{runs}"
    for sub in ("", "state", "out"):
        (d / sub).mkdir(exist_ok=True)
        os.chown(d / sub, user.pw_uid, user.pw_gid)
    script = write_script(d / "job.sh", "exec sleep 100000")  # no srun: a job's RPCs would count as ours
    config = write_daemon_config(
        d / "supervisor.toml",
        cluster,
        d / "state",
        poll_interval_s=POLL_S,
        probe_timeout_s=1.0,
        confirm_after_s=1.0,
        log_level="debug",
    )
    names = [f"load{runs}-{i:02d}" for i in range(1, runs + 1)]
    specs = [
        write_run_spec(
            d / f"{name}.toml",
            name=name,
            script=script,
            partition=cluster.partition,
            nodes=1,
            output=d / "out" / "%x-%j.out",
        )
        for name in names
    ]
    log_path = d / "daemon.log"
    log_path.touch()
    m = Measurement(runs)
    daemon: DaemonProc = start_daemon(config, cluster, log_path, user=user.pw_name)
    try:
        for spec in specs:
            supervisor_cli(config, cluster, "submit", str(spec), user=user.pw_name)
        tags = tuple(f"{TAG_PREFIX}:{name}:" for name in names)

        def all_running() -> bool:
            if not daemon.alive():
                raise RuntimeError(f"daemon exited ({daemon.proc.returncode}):\n{daemon.log_tail()}")
            ours = [j for j in jobs(cluster) or [] if j.comment.startswith(tags)]
            return sum(j.state == "RUNNING" for j in ours) == runs

        wait_for(all_running, 120, f"{runs} runs' jobs RUNNING", interval=0.5)

        def daemon_sees_all() -> bool:
            status = json.loads(supervisor_cli(config, cluster, "status", "--json", user=user.pw_name))
            return sum(r["state"] == "running" for r in status) == runs

        wait_for(daemon_sees_all, 60, f"daemon reports {runs} runs running", interval=0.5)
        time.sleep(SETTLE_S)
        slurmd_lines_before = _slurmd_log_lines(cluster)
        cluster.run(["sdiag", "-r"], check=True)
        t_a = time.time()
        time.sleep(window)
        t_b = time.time()
        stats = parse_sdiag(cluster.run(["sdiag"], check=True).stdout)
        m.slurmd_log_lines = _slurmd_log_lines(cluster) - slurmd_lines_before
        m.window_s = t_b - t_a
        m.user_rpcs = stats.by_user.get(user.pw_name, 0)
        m.user_rpc_time_ms = stats.user_time_us.get(user.pw_name, 0) / 1000
        m.other_rpcs = {u: c for u, c in stats.by_user.items() if u != user.pw_name}
        m.by_type = stats.by_type
        for rec in daemon.log_records():
            at = log_time(rec)
            if rec.get("event") == "slurm.call" and at is not None and t_a <= at < t_b:
                command = (rec.get("argv") or ["?"])[0]
                m.calls[command] = m.calls.get(command, 0) + 1
        m.ticks = m.calls.get("squeue", 0)
        ours = [j for j in jobs(cluster) or [] if j.comment.startswith(tags)]
        m.still_running = sum(j.state == "RUNNING" for j in ours)
    finally:
        daemon.stop()
    return m


def _slurmd_log_lines(cluster: LocalSlurm) -> int:
    return sum(len(p.read_text(errors="replace").splitlines()) for p in (cluster.root / "log").glob("slurmd-*.log"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=float, default=30.0, help="seconds between sdiag -r and sdiag (default 30)")
    parser.add_argument("--runs", default="1,20", help="comma-separated run counts (default 1,20)")
    parser.add_argument("--user", default="ssvbench", help="Unix user the daemon runs as (created if missing)")
    parser.add_argument("--keep", action="store_true", help="keep the work and cluster directories")
    parser.add_argument("--slurm-release", help="run on this release of the matrix (22.05, 24.11, 26.05)")
    args = parser.parse_args()
    run_on_release(args.slurm_release)
    counts = [int(x) for x in args.runs.split(",")]
    if max(counts) > NODES:
        parser.error(f"at most {NODES} runs (one node each)")
    quiet_logs()
    user = ensure_user(args.user)

    work = Path(tempfile.mkdtemp(prefix="ssv-ctlload-"))
    work.chmod(0o755)
    results: list[Measurement] = []
    release_seen = "unknown"
    started = time.monotonic()
    try:
        with LocalSlurm(NODES, keep_dir=args.keep) as cluster:
            release_seen = slurm_version(cluster)
            print(
                f"# cluster: {NODES} nodes, conf {cluster.slurm_conf}; daemon as {user.pw_name} "
                f"(uid {user.pw_uid}), poll_interval_s={POLL_S}, window {args.window:.0f} s",
                flush=True,
            )
            for runs in counts:
                m = measure(cluster, work, user, runs, args.window)
                results.append(m)
                print(
                    f"#   {runs} runs: {m.user_rpcs} RPCs by {user.pw_name} in {m.ticks} ticks ({m.window_s:.1f} s)",
                    flush=True,
                )
            cluster.reset(timeout=90)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    print()
    rows = [
        (
            m.runs,
            f"{m.window_s:.1f}",
            m.ticks,
            " ".join(f"{k}={v}" for k, v in sorted(m.calls.items())),
            m.user_rpcs,
            f"{m.rpcs_per_tick:.2f}" if m.rpcs_per_tick is not None else "-",
            f"{m.user_rpc_time_ms / m.ticks:.2f}" if m.ticks else "-",
            f"{m.still_running}/{m.runs}",
            m.slurmd_log_lines,
        )
        for m in results
    ]
    print(
        table(
            rows,
            [
                "runs",
                "window_s",
                "ticks",
                "daemon's client calls",
                f"RPCs({user.pw_name})",
                "RPCs/tick",
                "ctld_ms/tick",
                "running_after",
                "slurmd_log_lines",
            ],
        )
    )
    types = sorted({t for m in results for t in m.by_type})
    print(
        "\nRPCs by message type in each window, all users (sdiag has no type-by-user table; in the window the\n"
        "daemon is the only client calling slurmctld, except the closing sdiag itself: REQUEST_STATS_INFO, root):"
    )
    type_rows = [
        (t, *(f"{m.by_type.get(t, 0)} ({m.by_type.get(t, 0) / m.ticks:.2f}/tick)" if m.ticks else "-" for m in results))
        for t in types
    ]
    print(table(type_rows, ["type", *(f"{m.runs} runs" for m in results)]))
    print(
        "MESSAGE_* types come from slurmd (root), e.g. periodic node registrations. Client request types add "
        "up to the daemon user's count: " + "; ".join(f"{m.runs} runs: {m.types_account_for_user}" for m in results)
    )
    print(
        "\nRPCs by other users in each window: "
        + "; ".join(f"{m.runs} runs: {m.other_rpcs or 'none'}" for m in results)
    )

    by_runs = {m.runs: m for m in results}
    result: dict[str, object] = {}
    for m in results:
        result[f"rpcs_per_tick_{m.runs}"] = round(m.rpcs_per_tick, 3) if m.rpcs_per_tick is not None else None
    result.update(
        {
            "ticks": {str(m.runs): m.ticks for m in results},
            "user_rpcs": {str(m.runs): m.user_rpcs for m in results},
            "daemon_rpcs_by_type_per_tick": {
                str(m.runs): {t: round(c / m.ticks, 3) for t, c in sorted(m.client_types.items())}
                for m in results
                if m.ticks
            },
            "types_account_for_user": {str(m.runs): m.types_account_for_user for m in results},
            "window_s": args.window,
            "slurm": release_seen,
            "poll_interval_s": POLL_S,
            "user": user.pw_name,
            "goal_met": all(m.rpcs_per_tick is not None and m.rpcs_per_tick <= 2.0 for m in results)
            and (len(by_runs) < 2 or _not_growing(results)),
            "wall_s": round(time.monotonic() - started, 1),
        }
    )
    print(json.dumps(result))
    ok = all(m.ticks and m.still_running == m.runs for m in results)
    return 0 if ok else 1


def _not_growing(results: list[Measurement]) -> bool:
    rates = [m.rpcs_per_tick or 0.0 for m in sorted(results, key=lambda m: m.runs)]
    return rates[-1] <= rates[0] * 1.1 + 0.1


if __name__ == "__main__":
    sys.exit(main())
