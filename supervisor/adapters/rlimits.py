"""RLIMIT_NOFILE at the daemon's start: the soft limit raised to the hard one (issue 14).

systemd's default for services is a soft limit of 1,024 (hard 524,288): a daemon probing and
hearing from a few thousand nodes needs more, and a soft limit exists so that programs which need
more raise it themselves. The units set ``LimitNOFILE=`` too; this covers a daemon started another
way (by hand, under a user manager with a low default). The probe and the ingest size themselves
from whatever limit results, so a hard limit of 1,024 still works, only with smaller windows.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)

NR_OPEN = "/proc/sys/fs/nr_open"  # the kernel's ceiling on one process's descriptors


@dataclass(frozen=True)
class NofileLimit:
    before: int
    after: int
    hard: int
    error: str | None = None  # why it could not be raised


def raise_nofile(nr_open_path: str = NR_OPEN) -> NofileLimit:
    """Raise the soft RLIMIT_NOFILE to the hard limit (or the kernel's ceiling when unlimited)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else _kernel_ceiling(nr_open_path, soft)
    if soft != resource.RLIM_INFINITY and soft >= target:
        return NofileLimit(soft, soft, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        log.warning("nofile_not_raised", soft=soft, hard=hard, error=str(exc))
        return NofileLimit(soft, soft, hard, str(exc))
    log.info("nofile_raised", soft_before=soft, soft=target, hard=hard)
    return NofileLimit(soft, target, hard)


def _kernel_ceiling(path: str, fallback: int) -> int:
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return max(fallback, 65536)
