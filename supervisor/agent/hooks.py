"""Slurm's Prolog, Epilog and HealthCheckProgram: one bounded NVML look, then act and report.

* prolog — before the job starts. A fatal finding exits non-zero: Slurm drains the node ("Prolog
  error") and requeues the job *held*; the supervisor releases its run's job, which then starts
  elsewhere. Bounded: the NVML read is killed at ``nvml_timeout_s`` (a wedged driver counts as
  fatal), the report gets ``post_timeout_s``; ~5 s in all.
* epilog — after the job ends: records the GPUs' state and the job's exit; a fatal finding exits
  non-zero, so Slurm drains the node before it takes another job.
* healthcheck — periodic (HealthCheckProgram). Slurm ignores its exit status, so a fatal finding
  drains the node through ``scontrol`` itself (argv, never a shell) with the finding as reason.

Each reports to the daemon (``POST /v1/reports/HOOKS`` with the site's hook token) when it can,
and spools the report to ``spool_dir`` when it cannot; the next hook on the node sends the spool
first. The token file is used only when it is a regular file of root's (or the hook user's) that
nobody else can read, the spool only when nobody else can write it (``agent.spool``). Nothing from the job's environment reaches a shell or an argv unchecked: the node name
must look like a host name, the job id like a number, and values are cut and cleaned before they
are logged.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from msgspec.structs import replace

from supervisor.agent.oneshot import CheckResult, check_once
from supervisor.agent.sender import HttpSender, SenderSettings
from supervisor.agent.spool import Spool
from supervisor.config.hooks_file import HooksConfig
from supervisor.domain.health.findings import NodeFinding, Severity
from supervisor.domain.health.node_report import NodeReport

HOOKS_RUN = "HOOKS"  # the pseudo-run hooks report under (see adapters.web.tokens)
KINDS = ("prolog", "epilog", "healthcheck")
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_JOB = re.compile(r"^[0-9]{1,12}$")
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")


@dataclass
class HookOutcome:
    kind: str
    node: str
    exit_code: int
    findings: tuple[NodeFinding, ...] = ()
    sent: int = 0
    spooled: int = 0
    drained: bool = False
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        return {
            "event": f"hook_{self.kind}",
            "node": self.node,
            "exit_code": self.exit_code,
            "findings": [{"severity": f.severity.value, "rule": f.rule, "reason": f.reason} for f in self.findings],
            "sent": self.sent,
            "spooled": self.spooled,
            "drained": self.drained,
            "notes": self.notes,
        }


def clean(value: str | None, limit: int = 64) -> str:
    """A value from the job's environment made safe to log: printable ASCII, cut short."""
    return _UNPRINTABLE.sub("?", (value or "")[:limit])


def node_of(env: Mapping[str, str]) -> str:
    node = env.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]
    if not _NODE.match(node):
        raise ValueError(f"node name {clean(node)!r} does not look like a host name")
    return node


def run_hook(kind: str, cfg: HooksConfig, env: Mapping[str, str]) -> HookOutcome:
    if kind not in KINDS:
        raise ValueError(f"unknown hook {kind!r}; one of {', '.join(KINDS)}")
    node = node_of(env)
    h = cfg.hooks
    result = check_once(
        h.nvml_timeout_s,
        node=node,
        source=kind,
        settings=cfg.gpu_health.to_settings(),
        library_path=str(h.nvml_library) if h.nvml_library else None,
    )
    fatal = [f for f in result.findings if f.severity is Severity.FATAL]
    out = HookOutcome(kind, node, 1 if fatal and kind != "healthcheck" else 0, result.findings)
    if result.error:
        out.notes.append(f"nvml: {result.error}")
    job = env.get("SLURM_JOB_ID", "")
    if job and _JOB.match(job):
        exit_info = ",".join(
            f"{k}={clean(env[k], 16)}" for k in ("SLURM_JOB_EXIT_CODE", "SLURM_JOB_DERIVED_EC") if k in env
        )
        out.notes.append(f"job {job}" + (f" ({exit_info})" if exit_info else ""))
    if fatal and kind == "healthcheck":
        out.drained = _drain(h.scontrol, node, fatal[0], out)
    _report(result, cfg, node, out)
    return out


def _drain(scontrol: str, node: str, finding: NodeFinding, out: HookOutcome) -> bool:
    reason = f"slurm-supervisor healthcheck: {finding.reason} [rule {finding.rule}]"[:200]
    argv = [scontrol, "update", f"nodename={node}", "state=drain", f"reason={reason}"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)  # noqa: S603
    except (OSError, subprocess.TimeoutExpired) as exc:
        out.notes.append(f"scontrol failed: {exc}")
        return False
    if done.returncode != 0:
        out.notes.append(f"scontrol exited {done.returncode}: {clean(done.stderr, 200)}")
    return done.returncode == 0


def _report(result: CheckResult, cfg: HooksConfig, node: str, out: HookOutcome) -> None:
    h = cfg.hooks
    spool = Spool(h.spool_dir, h.spool_max)
    report = result.report
    if report is not None:
        # hooks run as separate processes: a time-based sequence keeps their reports in order
        report = replace(report, seq=time.time_ns() // 1000, source=out.kind)
    token = _token(h.token_file, out.notes)
    if h.url is None or token is None:
        out.notes.append("not reported: [hooks] url and a usable token_file are not both set; spooled")
    elif _send(h.url, token, node, cfg, spool, report, out):
        return
    if report is not None:
        out.spooled += spool.put(report)
    _spool_note(spool, out)


def _send(
    url: str, token: str, node: str, cfg: HooksConfig, spool: Spool, report: NodeReport | None, out: HookOutcome
) -> bool:
    """Send the spool, then ``report``; whether the daemon took them (the spool files are gone)."""
    h = cfg.hooks
    settings = SenderSettings(buffer_max=h.spool_max + 1, batch_max=64, timeout_s=h.post_timeout_s)
    sender = HttpSender(url, HOOKS_RUN, token, node, settings)
    spooled, queued = spool.take()
    for r in [*queued, *([report] if report is not None else [])]:
        sender.add(r)
    try:
        ok = sender.flush(time.time(), force=True)
    finally:
        sender.close()
    if ok:
        out.sent = len(queued) + (report is not None)
        for f in spooled:
            f.unlink(missing_ok=True)
    return ok


def _spool_note(spool: Spool, out: HookOutcome) -> None:
    if spool.problem:
        out.notes.append(spool.problem)


def _token(path: Path | None, notes: list[str]) -> str | None:
    """The hook token, from a regular file of root's (or this user's) no one else can read."""
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        notes.append(f"token_file {path} unreadable: {exc.strerror or exc}")
        return None
    try:
        st = os.fstat(fd)
        problem = _token_problem(st)
        if problem:
            notes.append(f"token_file {path} not used: {problem}")
            return None
        return os.read(fd, 4096).decode("utf-8", errors="replace").strip() or None
    finally:
        os.close(fd)


def _token_problem(st: os.stat_result) -> str | None:
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid not in (0, os.geteuid()):
        return f"owned by uid {st.st_uid}, not root; chown root it"
    if st.st_mode & 0o077:
        return f"readable or writable by others (mode {stat.S_IMODE(st.st_mode):o}); chmod 600 it"
    return None
