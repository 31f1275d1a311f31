"""The GPU health table: which XIDs and driver recovery actions mean what, every threshold, and
the ``Condition`` a rule reports.

* **fatal** — drain now, restart the run without the node: a GPU lost or fallen off the bus,
  uncorrectable ECC, a failed row remap, GSP failures, a driver recovery action that needs a
  reset or a reboot, fewer GPUs than the node should have.
* **degraded** — keep the node out at the next restart or checkpoint boundary: a row remap or
  page retirement waiting for a reset, too many retired pages, contained ECC errors, HW slowdown
  (thermal or power brake) sustained for ``slowdown_samples`` reports.
* **watch** — record it: application-class XIDs (13, 31, 43, 45 ...), corrected-ECC or NVLink
  error bursts, heat, host memory pressure, a driver the agent cannot read.

What a report shows is domain.health.gpu_conditions; the rules applied with hysteresis, domain.health.gpu_health.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from supervisor.domain.health.findings import Severity

FATAL, DEGRADED, WATCH = Severity.FATAL, Severity.DEGRADED, Severity.WATCH

# XIDs after NVIDIA's XID catalogue (its "resolution bucket": RESTART_APP → watch; RESET_GPU,
# RESTART_BM, hardware/RMA → fatal; reset at the next opportunity → degraded). Unlisted XIDs
# are watch.
XID_CATALOGUE: Mapping[int, tuple[Severity, str]] = MappingProxyType(
    {
        8: (WATCH, "GPU stopped processing (application)"),
        13: (WATCH, "graphics engine exception (usually the application)"),
        31: (WATCH, "GPU memory page fault (usually the application)"),
        32: (WATCH, "invalid or corrupted push buffer stream"),
        43: (WATCH, "GPU stopped processing (application)"),
        45: (WATCH, "preemptive cleanup after an earlier error"),
        46: (FATAL, "GPU stopped processing"),
        48: (FATAL, "double-bit ECC error (DBE)"),
        61: (DEGRADED, "internal micro-controller breakpoint/warning"),
        62: (FATAL, "internal micro-controller halt"),
        63: (DEGRADED, "row remap / page retirement recorded: reset the GPU to activate"),
        64: (FATAL, "row remap / page retirement recording failure"),
        68: (WATCH, "video processor exception"),
        69: (WATCH, "graphics engine class error"),
        74: (FATAL, "NVLink error"),
        79: (FATAL, "GPU has fallen off the bus"),
        92: (DEGRADED, "high single-bit ECC error rate"),
        94: (DEGRADED, "contained ECC error: the GPU needs a reset at the next opportunity"),
        95: (FATAL, "uncontained ECC error"),
        109: (WATCH, "context switch timeout"),
        119: (FATAL, "GSP RPC timeout"),
        120: (FATAL, "GSP error"),
        121: (DEGRADED, "C2C link corrected error"),
        140: (FATAL, "unrecovered ECC error"),
        143: (FATAL, "GPU initialisation failure"),
        145: (WATCH, "NVLink non-fatal error"),
        149: (FATAL, "NVLink fatal error"),
    }
)

# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION values (nvml.h).
RECOVERY_ACTIONS: Mapping[int, tuple[Severity, str]] = MappingProxyType(
    {
        1: (FATAL, "GPU reset required"),
        2: (FATAL, "node reboot required"),
        3: (DEGRADED, "drain peer-to-peer traffic"),
        4: (DEGRADED, "drain and reset recommended"),
        5: (DEGRADED, "recover the IMEX domain"),
        6: (FATAL, "bus reset required"),
        7: (FATAL, "system reboot required"),
    }
)


@dataclass(frozen=True)
class GpuHealthSettings:
    """Every threshold of the table. TOML section ``[gpu_health]`` (keys = field names)."""

    persist_samples: int = 3  # a watch-level condition must be seen in this many reports in a row
    clear_samples: int = 5  # a fired condition must be absent this many reports to re-arm
    slowdown_samples: int = 6  # HW slowdown / thermal / power brake in a row → degraded
    retired_pages_max: int = 60  # retired pages (SBE + DBE) at or above → degraded
    ecc_corrected_burst: int = 1000  # corrected ECC errors between two reports → watch
    nvlink_error_burst: int = 100  # NVLink CRC/replay/recovery errors between two reports → watch
    temp_watch_c: int = 90
    host_mem_watch_pct: float = 95.0
    expected_gpus: int = 0  # GPUs a node must show; 0 = do not check
    xid_overrides: Mapping[int, Severity] = field(default_factory=dict)  # xid → severity
    xid_ignore: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        problems = [
            f"{name} must be at least 1 (got {getattr(self, name)!r})"
            for name in (
                "persist_samples",
                "clear_samples",
                "slowdown_samples",
                "retired_pages_max",
                "ecc_corrected_burst",
                "nvlink_error_burst",
            )
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1)
        ]
        if not 0 < self.host_mem_watch_pct <= 100:
            problems.append(f"host_mem_watch_pct must be within (0, 100] (got {self.host_mem_watch_pct})")
        if self.expected_gpus < 0:
            problems.append(f"expected_gpus must be 0 (no check) or more (got {self.expected_gpus})")
        bad = [x for x in list(self.xid_overrides) + list(self.xid_ignore) if not 0 < x < 100000]
        if bad:
            problems.append(f"XID numbers must be within 1..99999 (got {bad})")
        if problems:
            raise ValueError("; ".join(problems))

    def xid_class(self, xid: int) -> tuple[Severity, str] | None:
        if xid in self.xid_ignore:
            return None
        severity, text = XID_CATALOGUE.get(xid, (WATCH, "not in the catalogue"))
        return self.xid_overrides.get(xid, severity), text


@dataclass(frozen=True)
class Condition:
    """One rule seen in one report (for one GPU, or the node when ``gpu`` is None)."""

    rule: str  # without the version, e.g. "xid-79"
    severity: Severity
    reason: str
    persist: int
    gpu: int | None = None
    evidence: Mapping[str, object] = field(default_factory=dict)
