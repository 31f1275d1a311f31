"""One bounded NVML check, for Slurm hooks (prolog, epilog, healthcheck) and ``agent --once``.

``check_once(timeout_s)`` reads every GPU once in a child process (``python -P -m
supervisor.agent.oneshot``, started in ``/``: hooks run as root, and a ``supervisor`` package
planted in the working directory they were left in must never be imported) and judges the report
with the GPU-health rules. A driver call that
hangs (a wedged GPU) cannot hang the hook: the child is killed at the deadline and the result is
the fatal finding ``nvml-hung@1``. The child prints one JSON ``NodeReport``.

``send_result`` hands one check to the daemon through the agent's ``HttpSender`` (``agent --once
--send``, the launcher's pre-flight check of hot spares): an agent report with the run's token,
judged by the daemon's own rules. It promises no heartbeat (``interval_s`` 0).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import msgspec

from supervisor.domain.health.findings import NodeFinding, Severity
from supervisor.domain.health.gpu_health import RULES_VERSION, HealthRules
from supervisor.domain.health.gpu_table import GpuHealthSettings
from supervisor.domain.health.node_report import MAX_TEXT, SCHEMA_VERSION, NodeReport, to_wire
from supervisor.domain.text_safety import printable

if TYPE_CHECKING:
    from supervisor.agent.sender import HttpSender


@dataclass(frozen=True)
class CheckResult:
    findings: tuple[NodeFinding, ...]
    report: NodeReport | None  # None when the child timed out or failed
    elapsed_s: float
    error: str | None = None

    @property
    def worst(self) -> Severity | None:
        return max((f.severity for f in self.findings), key=lambda s: s.rank, default=None)


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def check_once(
    timeout_s: float = 4.0,
    *,
    node: str | None = None,
    source: str = "prolog",
    settings: GpuHealthSettings | None = None,
    library_path: str | None = None,
    env: Mapping[str, str] | None = None,
) -> CheckResult:
    """Read the GPUs once within ``timeout_s`` and judge them. Never raises, never hangs.

    Hysteresis does not apply to a single look: every condition counts as persistent."""
    node = node or node_name()
    settings = replace(settings or GpuHealthSettings(), persist_samples=1, slowdown_samples=1)
    argv = [sys.executable, "-P", "-m", "supervisor.agent.oneshot", node, source]
    if library_path:
        argv.append(library_path)
    start = time.monotonic()
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            timeout=timeout_s,
            check=False,  # noqa: S603
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            cwd="/",
        )
    except subprocess.TimeoutExpired:
        return _hung(node, source, timeout_s, time.monotonic() - start)
    return _judged(done, settings, time.monotonic() - start)


def _hung(node: str, source: str, timeout_s: float, elapsed: float) -> CheckResult:
    """The child did not answer in time: the fatal finding ``nvml-hung``."""
    finding = NodeFinding(
        node=node,
        severity=Severity.FATAL,
        rule=f"nvml-hung@{RULES_VERSION}",
        reason=f"NVML did not answer within {timeout_s:g} s (wedged driver or GPU)",
        at=time.time(),
        source=source,
        evidence={"timeout_s": timeout_s},
    )
    return CheckResult((finding,), None, elapsed, f"timed out after {timeout_s:g} s")


def _judged(done: subprocess.CompletedProcess[bytes], settings: GpuHealthSettings, elapsed: float) -> CheckResult:
    """The child's report judged by the GPU-health rules; no finding when it printed no report."""
    try:
        report = msgspec.json.decode(done.stdout, type=NodeReport)
    except (msgspec.DecodeError, msgspec.ValidationError):
        tail = (done.stderr or b"").decode(errors="replace").strip()[-500:]
        return CheckResult((), None, elapsed, f"NVML check failed (exit {done.returncode}): {tail}")
    findings = HealthRules(settings).evaluate(report, time.time())
    return CheckResult(tuple(findings), report, elapsed)


def as_agent_report(result: CheckResult, node: str) -> NodeReport:
    """What the check read, as the agent would report it (a run's token sends agent reports only);
    a check without a report (NVML hung, the child failed) says why, as the agent's heartbeat does."""
    if result.report is not None:
        return msgspec.structs.replace(result.report, source="agent", interval_s=0.0)
    why = printable(result.error or "no GPU reading", MAX_TEXT)
    return NodeReport(v=SCHEMA_VERSION, node=node, seq=0, at=time.time(), source="agent", errors=(why,))


def send_result(sender: HttpSender, report: NodeReport, within_s: float, pause_s: float = 0.25) -> str | None:
    """Send ``report`` until the daemon takes it or ``within_s`` has passed; None when taken, else
    why not. A refusal that may pass (401/403/404: the daemon's tick has not yet seen this job's
    nodes; a daemon restarting) is retried, backing off; a malformed report is not."""
    deadline = time.monotonic() + within_s
    sender.add(report)
    pause, waiter = pause_s, threading.Event()
    while not sender.flush(time.time(), force=True):
        left = deadline - time.monotonic()
        if left <= 0:
            return sender.problem or "not taken"
        waiter.wait(min(pause, left))
        pause = min(2 * pause, 5.0)
    return None if sender.rejected_total == 0 else f"refused as malformed ({sender.last_rejection})"


def _child(node: str, source: str, library_path: str | None) -> int:
    from supervisor.adapters.nvml import NvmlReader, NvmlUnavailable

    reader = NvmlReader(library_path)
    try:
        reader.open()
    except NvmlUnavailable as exc:
        report = NodeReport(v=SCHEMA_VERSION, node=node, seq=0, at=time.time(), source=source, errors=(str(exc),))
    else:
        try:
            gpus = tuple(reader.sample())
            report = NodeReport(
                v=SCHEMA_VERSION,
                node=node,
                seq=0,
                at=time.time(),
                source=source,
                gpu_count=reader.gpu_count,
                gpus=gpus,
                errors=tuple(reader.errors),
                driver=reader.driver,
            )
        finally:
            reader.close()
    sys.stdout.write(json.dumps(to_wire(report), separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))
