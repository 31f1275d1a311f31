"""An honest instance uses the node guard while another account floods it (issue 32).

The real guard (``Guard`` with its SQLite memory and audit log, ``GuardServer`` on a Unix socket)
runs in this process as root; Slurm is a stand-in that answers each node read after 5 ms (what a
node-scoped ``squeue`` takes here), where Slurm itself is not the point (as in the 2026-12-02
review). The honest instance is a child process of its own UID, through the real client (``GuardClient``) (``daemon``, uid 1): every 100 ms it
reads the shared quarantine, and every 2 s it drains one of its own nodes (ten times the rate of
faults an instance sees in a bad hour). After ``--calm``
seconds, for ``--duration`` seconds, ``nobody`` attacks from three child processes:

* ``slots``: connections opened as fast as it can and never written to (held 400 at a time);
* ``malformed``: lines that are not requests, as fast as the guard answers;
* ``faults``: DRAINs of a node of its own job under a new run name each time, and DOWNs.

Last line JSON: ``honest_p99_ms`` (goal < 200), ``honest_refused`` (goal 0: answers that were not
grants, or no answer), ``audit_bytes_per_min_under_flood`` (bounded by the per-UID rate of grants,
about one 0.8 KB line a second: goal < 200 KB; the review measured 3.2 MB in 5 s), ``guard_errors``
(goal 0: requests the guard failed on), with the calm baseline and how many attack requests were
answered. Needs root (the callers are other UIDs). ~40 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
from structlog.testing import capture_logs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from supervisor.domain.cluster import JobInfo, JobState, NodeChange  # noqa: E402
from supervisor.domain.health.quarantine import QuarantineSettings  # noqa: E402
from supervisor.guard.audit import AuditLog  # noqa: E402
from supervisor.guard.memory import GuardMemory  # noqa: E402
from supervisor.guard.policy import Limits  # noqa: E402
from supervisor.guard.server import GuardServer, bound_socket  # noqa: E402
from supervisor.guard.service import Guard  # noqa: E402
from supervisor.testing.slurm.users import python_for_others  # noqa: E402

HONEST_UID, ATTACKER_UID = 1, 65534
GOALS = {"honest_p99_ms": 200, "honest_refused": 0, "audit_bytes_per_min_under_flood": 200_000, "guard_errors": 0}

HONEST = """
import sys, time
from supervisor.adapters.guard_client import GuardClient
from supervisor.ports import PortError
client, end, out = GuardClient(sys.argv[1], timeout_s=15), time.monotonic() + float(sys.argv[2]), []
def ask(req):
    started = time.monotonic()
    try:
        answer = client.ask(req)
        ok = "granted" if answer.get("granted") is True else str(answer.get("rule"))
    except PortError as exc:
        ok = type(exc).__name__
    out.append((time.time(), (time.monotonic() - started) * 1000, ok))
i = 0
while time.monotonic() < end:
    ask({"op": "QUARANTINE"})
    if i % 20 == 0:
        ask({"op": "DRAIN", "node": f"h{i // 20 % 8 + 1}", "run": "honest", "cause": "xid 79"})
    i += 1
    time.sleep(0.1)
import json
print(json.dumps(out))
"""
ATTACKS = {
    "slots": """
import socket, sys, time
held, end = [], time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(sys.argv[1])
    except OSError:
        s.close(); time.sleep(0.002); continue
    held.append(s)
    if len(held) > 400:
        held.pop(0).close()
print(0)
""",
    "malformed": """
import socket, sys, time
n, end = 0, time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2); s.connect(sys.argv[1]); s.sendall(b'{"op": "DRAIN", "node": "$(reboot)"}\\n')
            n += bool(s.recv(4096))
    except OSError:
        pass
print(n)
""",
    "faults": """
import json, socket, sys, time
n, end = 0, time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    for op in ("DRAIN", "DOWN"):
        req = {"op": op, "node": "a1", "run": f"spam-{n}", "cause": "x" * 1900}
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(2); s.connect(sys.argv[1]); s.sendall(json.dumps(req).encode() + b"\\n")
                n += bool(s.recv(4096))
        except OSError:
            pass
print(n)
""",
}


class StandInSlurm:
    """The honest account's job on h1..h8, the attacker's on a1; each node read takes 5 ms."""

    def __init__(self) -> None:
        self.jobs = (
            JobInfo(
                job_id=1,
                name="h",
                state=JobState.RUNNING,
                nodes=tuple(f"h{i}" for i in range(1, 9)),
                user_id=HONEST_UID,
            ),
            JobInfo(job_id=2, name="a", state=JobState.RUNNING, nodes=("a1",), user_id=ATTACKER_UID),
        )
        self.reads = 0

    def jobs_on(self, node: str) -> tuple[JobInfo, ...]:
        self.reads += 1
        time.sleep(0.005)
        return tuple(j for j in self.jobs if node in j.nodes)

    def set_node_state(self, node: str, change: NodeChange, reason: str) -> None:
        time.sleep(0.005)


def child(uid: int, script: str, path: Path, seconds: float) -> subprocess.Popen[str]:
    python, env = python_for_others()  # an interpreter other accounts may run, with this project on its path
    argv = [*python, "-c", script, str(path), str(seconds)]
    return subprocess.Popen(
        argv, env=env, user=uid, group=uid, extra_groups=[], stdout=subprocess.PIPE, text=True, cwd="/"
    )


def p99(samples: list[list[float]]) -> float:
    return round(float(np.percentile([ms for _, ms, _ in samples], 99)), 1) if samples else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calm", type=float, default=5.0)
    parser.add_argument("--duration", type=float, default=30.0)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("guard_abuse: run as root (the honest caller and the attacker are other UIDs)")
    work = Path(tempfile.mkdtemp(prefix="ssv-guard-abuse-"))
    work.chmod(0o755)
    slurm, audit_path = StandInSlurm(), work / "state" / "audit.jsonl"
    memory = GuardMemory(work / "state")
    guard = Guard(
        slurm=slurm,
        memory=memory,
        audit=AuditLog(audit_path),
        limits=Limits(max_drains=1000),
        quarantine=QuarantineSettings(faults=1),
    )
    server = GuardServer(bound_socket(work / "guard.sock"), guard)
    stop = threading.Event()
    with capture_logs() as logs:
        serving = threading.Thread(target=server.serve, args=(stop,), daemon=True)
        serving.start()
        honest = child(HONEST_UID, HONEST, server_path := work / "guard.sock", args.calm + args.duration)
        time.sleep(args.calm)
        flood_from, audit_before = time.time(), audit_path.stat().st_size
        attackers = {name: child(ATTACKER_UID, script, server_path, args.duration) for name, script in ATTACKS.items()}
        answered = {name: int(proc.communicate(timeout=args.duration + 60)[0] or 0) for name, proc in attackers.items()}
        flood_s = time.time() - flood_from
        audit_bytes = sum(p.stat().st_size for p in audit_path.parent.glob("audit.jsonl*")) - audit_before
        samples = json.loads(honest.communicate(timeout=60)[0])
        stop.set()
        serving.join(30)
    guard.audit.close()
    memory.close()
    shutil.rmtree(work, ignore_errors=True)
    calm = [s for s in samples if s[0] < flood_from]
    flood = [s for s in samples if s[0] >= flood_from]
    result = {
        "honest_p99_ms": p99(flood),
        "honest_refused": sum(ok != "granted" for _, _, ok in samples),
        "honest_refusals": dict(Counter(ok for _, _, ok in samples if ok != "granted")),
        "audit_bytes_per_min_under_flood": round(audit_bytes / flood_s * 60),
        "guard_errors": sum(e["event"] == "guard.request_failed" for e in logs),
        "baseline_p99_ms": p99(calm),
        "honest_requests": len(samples),
        "attack_answers": answered,
        "slurm_reads": slurm.reads,
    }
    met = all(result[k] <= goal for k, goal in GOALS.items())
    print(json.dumps({**result, "goals_met": met}))


if __name__ == "__main__":
    main()
