"""The failure model: published interruption rates, how each failure shows, and what repairs it.

The default mix is Table 5 of "The Llama 3 Herd of Models" (arXiv:2407.21783, Sec. 3.3.4): 419
unexpected interruptions in 54 days of pre-training on 16,384 H100 GPUs (2,048 nodes of 8). The
categories are weighted by their COUNTS: the paper's printed percentages do not add up (the
"Faulty GPU" row says 30.1% where 148/419 is 35.3%); ``TABLE5`` keeps both so the typo stays
visible. The rate is scaled linearly to the simulated GPU count.

Optionally the GPU failures come from the ORNL Titan GPU trace (Ostrouchov et al., SC20):
double-bit ECC errors (DBE) and GPUs off the bus (OTB) per GPU-year of operation.

Every category is mapped to how it SHOWS (``Manifestation``) and what REPAIRS it (``Repair``).
A draw is seeded: the same seed gives the same failure times and causes in every mode, so a
supervisor run and a baseline run on one seed are a paired comparison.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from statistics import NormalDist

DAY_S = 86400.0


class Manifestation(StrEnum):
    """How a failure shows to the job, to Slurm, to a node agent and to the site health check."""

    XID = "xid"  # GPU fault (XID 79 fallen off the bus, GSP timeout): the job's process dies
    ECC = "ecc"  # uncorrectable ECC / row-remap failure (XID 48/94/95): the job's process dies
    NIC = "nic"  # the node's InfiniBand port dies: NCCL error kills the job
    HOST_DOWN = "host_down"  # the host dies (PSU, CPU, memory, board): slurmd and processes gone
    HANG = "hang"  # a collective never completes: processes alive, no progress
    NCCL_ERROR = "nccl_error"  # a fabric error kills the job; no node is at fault afterwards
    SOFTWARE = "software"  # a bug or a dependency: the job exits non-zero; nothing wrong with nodes
    SDC = "sdc"  # silent data corruption caught by the trainer's checks: the job stops
    STRAGGLER = "straggler"  # a slow node: every step of the job slows down (no interruption)

    @property
    def kills_job(self) -> bool:
        """The job's processes exit at once (a crash), as opposed to hanging or slowing down."""
        return self not in (Manifestation.HANG, Manifestation.STRAGGLER, Manifestation.HOST_DOWN)

    @property
    def agent_visible(self) -> bool:
        """A node agent (NVML, IB counters, heartbeats) reports it within one sample interval."""
        return self in (
            Manifestation.XID,
            Manifestation.ECC,
            Manifestation.NIC,
            Manifestation.HOST_DOWN,
            Manifestation.STRAGGLER,
        )

    @property
    def health_check_visible(self) -> bool:
        """Slurm's HealthCheckProgram (NHC: GPU count, ECC, IB port state) drains the node."""
        return self in (Manifestation.XID, Manifestation.ECC, Manifestation.NIC)

    @property
    def interrupts(self) -> bool:
        return self is not Manifestation.STRAGGLER

    @property
    def node_level(self) -> bool:
        """It is a fault OF a node (it strikes that node wherever the job runs), as opposed to a
        fault of the job (a bug, a fabric error, a hang) that strikes the job wherever it runs."""
        return self in _NODE_LEVEL


_NODE_LEVEL = frozenset(
    (Manifestation.XID, Manifestation.ECC, Manifestation.NIC, Manifestation.HOST_DOWN, Manifestation.STRAGGLER)
)


class RepairKind(StrEnum):
    NONE = "none"  # nothing is wrong with a node afterwards
    REBOOT = "reboot"  # the node is back after a reboot (minutes)
    REPLACE = "replace"  # a part or the node is replaced (hours)


@dataclass(frozen=True)
class Category:
    component: str  # Table 5's "Component"
    group: str  # Table 5's "Category"
    count: int  # interruptions in the 54 days
    printed_percent: float  # as printed in the paper (one of them is wrong)
    shows: Manifestation
    repair: RepairKind
    xid: int | None = None  # the XID a node agent would report

    @property
    def hardware(self) -> bool:
        return self.group in ("GPU", "Host", "Network", "Unplanned Maintenance")


_M, _R = Manifestation, RepairKind
#: Llama 3 Table 5, in the paper's order, with the simulator's mapping.
TABLE5: tuple[Category, ...] = (
    Category("Faulty GPU", "GPU", 148, 30.1, _M.XID, _R.REPLACE, 79),
    Category("GPU HBM3 Memory", "GPU", 72, 17.2, _M.ECC, _R.REBOOT, 94),
    Category("Software Bug", "Dependency", 54, 12.9, _M.SOFTWARE, _R.NONE),
    Category("Network Switch/Cable", "Network", 35, 8.4, _M.NCCL_ERROR, _R.NONE),
    Category("Host Maintenance", "Unplanned Maintenance", 32, 7.6, _M.HOST_DOWN, _R.REBOOT),
    Category("GPU SRAM Memory", "GPU", 19, 4.5, _M.ECC, _R.REBOOT, 48),
    Category("GPU System Processor", "GPU", 17, 4.1, _M.XID, _R.REBOOT, 119),
    Category("NIC", "Host", 7, 1.7, _M.NIC, _R.REPLACE),
    Category("NCCL Watchdog Timeouts", "Unknown", 7, 1.7, _M.HANG, _R.NONE),
    Category("Silent Data Corruption", "GPU", 6, 1.4, _M.SDC, _R.NONE),
    Category("GPU Thermal Interface + Sensor", "GPU", 6, 1.4, _M.XID, _R.REPLACE, 62),
    Category("SSD", "Host", 3, 0.7, _M.HOST_DOWN, _R.REPLACE),
    Category("Power Supply", "Host", 3, 0.7, _M.HOST_DOWN, _R.REPLACE),
    Category("Server Chassis", "Host", 2, 0.5, _M.HOST_DOWN, _R.REPLACE),
    Category("IO Expansion Board", "Host", 2, 0.5, _M.HOST_DOWN, _R.REPLACE),
    Category("Dependency", "Dependency", 2, 0.5, _M.SOFTWARE, _R.NONE),
    Category("CPU", "Host", 2, 0.5, _M.HOST_DOWN, _R.REPLACE),
    Category("System Memory", "Host", 2, 0.5, _M.HOST_DOWN, _R.REPLACE),
)
TABLE5_DAYS = 54.0
TABLE5_GPUS = 16384
TABLE5_TOTAL = sum(c.count for c in TABLE5)  # 419

#: An optional extra category for what-if runs (not in Table 5: slow nodes do not interrupt).
STRAGGLER = Category("Slow node", "GPU", 0, 0.0, _M.STRAGGLER, _R.REBOOT)


@dataclass(frozen=True)
class RepairTimes:
    """How long a node is out of service after a failure, by repair kind (log-normal, median and
    spread as a multiplicative sigma)."""

    reboot_s: float = 15 * 60.0
    replace_s: float = 4 * 3600.0
    sigma: float = 0.5

    def draw(self, kind: RepairKind, u: float) -> float:
        if kind is RepairKind.NONE:
            return 0.0
        median = self.reboot_s if kind is RepairKind.REBOOT else self.replace_s
        z = _norm_ppf(min(max(u, 1e-9), 1 - 1e-9))
        return median * math.exp(self.sigma * z)


@dataclass(frozen=True)
class Failure:
    """One drawn failure. ``u_node`` picks the node among the job's nodes when it strikes;
    ``u_repair`` the repair time; both fixed by the seed, so both modes see the same draw.
    A replayed fault trace (``fault_trace``) pins a node-level failure on one node of the pool
    (``node_index``) and gives its repair time (``repair_s``)."""

    at: float  # seconds after the start of the simulation
    category: Category
    u_node: float
    u_repair: float
    u_phase: float  # where in the site health check's cycle it falls
    node_index: int | None = None  # the pool's node it strikes (0-based), wherever the job runs
    repair_s: float | None = None  # how long that node is out (None: drawn from ``RepairTimes``)

    def lands_on(self, job_nodes: Sequence[str], pool: Sequence[str]) -> str | None:
        """The node it strikes: a pinned node-level failure its own node (None when this cluster's
        pool is smaller than the trace's), any other one of the job's nodes picked by ``u_node``."""
        if self.node_index is not None and self.category.shows.node_level:
            return pool[self.node_index] if self.node_index < len(pool) else None
        return job_nodes[min(len(job_nodes) - 1, int(self.u_node * len(job_nodes)))]

    def repair_time(self, times: RepairTimes) -> float:
        """Seconds its node is out: the trace's own repair (at least 1 s: a broken node always
        comes back), else a draw from ``times`` for the category's repair kind."""
        if self.category.repair is RepairKind.NONE:
            return 0.0
        if self.repair_s is None:
            return times.draw(self.category.repair, self.u_repair)
        return max(1.0, self.repair_s)


@dataclass(frozen=True)
class FailureModel:
    categories: tuple[Category, ...] = TABLE5
    per_gpu_hour: float = TABLE5_TOTAL / (TABLE5_DAYS * 24.0 * TABLE5_GPUS)
    source: str = "Llama 3 Table 5 (419 interruptions, 54 days, 16,384 GPUs)"

    def __post_init__(self) -> None:
        if not self.categories or sum(c.count for c in self.categories) <= 0:
            raise ValueError("a failure model needs at least one category with a positive count")
        if not (self.per_gpu_hour >= 0 and math.isfinite(self.per_gpu_hour)):
            raise ValueError(f"per_gpu_hour must be a non-negative number (got {self.per_gpu_hour})")

    @property
    def weights(self) -> tuple[float, ...]:
        total = sum(c.count for c in self.categories)
        return tuple(c.count / total for c in self.categories)

    def rate_per_s(self, gpus: int) -> float:
        return self.per_gpu_hour * gpus / 3600.0

    def mtbf_s(self, gpus: int) -> float:
        rate = self.rate_per_s(gpus)
        return math.inf if rate <= 0 else 1.0 / rate

    def expected(self, gpus: int, seconds: float) -> float:
        return self.rate_per_s(gpus) * seconds

    def with_stragglers(self, per_gpu_hour: float) -> FailureModel:
        """Add slow nodes at their own rate (weights stay by count: the count is scaled to it)."""
        if per_gpu_hour <= 0:
            return self
        extra = max(1, round(sum(c.count for c in self.categories) * per_gpu_hour / self.per_gpu_hour))
        cat = Category(STRAGGLER.component, STRAGGLER.group, extra, 0.0, STRAGGLER.shows, STRAGGLER.repair)
        return FailureModel(
            self.categories + (cat,),
            self.per_gpu_hour + per_gpu_hour,
            self.source + f" + slow nodes at {per_gpu_hour:.2e}/GPU-hour",
        )

    def draw(self, seed: int, gpus: int, seconds: float) -> list[Failure]:
        """A Poisson process at the scaled rate over ``seconds``, categories by count."""
        rng = random.Random(f"failures:{seed}")
        rate = self.rate_per_s(gpus)
        out: list[Failure] = []
        if rate <= 0:
            return out
        cats, weights = self.categories, self.weights
        t = 0.0
        while True:
            t += rng.expovariate(rate)
            if t >= seconds:
                return out
            cat = rng.choices(cats, weights)[0]
            out.append(Failure(t, cat, rng.random(), rng.random(), rng.random()))


def young_daly_interval(save_cost_s: float, mtbf_s: float) -> float:
    """Young/Daly's first-order optimal checkpoint interval: sqrt(2 × save cost × MTBF)."""
    if save_cost_s <= 0 or not math.isfinite(mtbf_s):
        raise ValueError("Young/Daly needs a positive save cost and a finite MTBF")
    return math.sqrt(2.0 * save_cost_s * mtbf_s)


def titan_model(path: str | Path) -> FailureModel:
    """GPU failures from the ORNL Titan trace (``gc_full.csv``): DBE (double-bit ECC) shows as an
    uncorrectable ECC error, OTB (off the bus) as an XID 79; the rate is events per GPU-hour of
    the trace's recorded operation."""
    dbe = otb = 0
    seconds = 0.0
    try:
        with open(path, newline="") as fh:
            for row in csv.DictReader(fh):
                seconds += float(row.get("duration") or 0.0)
                event = (row.get("event") or "").strip().upper()
                dbe += event == "DBE"
                otb += event == "OTB"
    except (OSError, KeyError, ValueError) as exc:
        raise ValueError(
            f"cannot read the Titan GPU trace {path}: {exc}; pass gc_full.csv "
            "(columns SN,location,insert,remove,duration,out,event)"
        ) from exc
    if seconds <= 0 or dbe + otb == 0:
        raise ValueError(f"the Titan trace {path} holds no GPU operation time or no DBE/OTB events")
    cats = (
        Category("Double-bit ECC (Titan DBE)", "GPU", dbe, 0.0, _M.ECC, _R.REPLACE, 48),
        Category("Off the bus (Titan OTB)", "GPU", otb, 0.0, _M.XID, _R.REPLACE, 79),
    )
    return FailureModel(
        cats,
        (dbe + otb) / (seconds / 3600.0),
        f"ORNL Titan GPU trace ({dbe} DBE + {otb} OTB over {seconds / 3600 / 24 / 365:.0f} GPU-years)",
    )


def by_cause(failures: Sequence[Failure]) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in failures:
        out[f.category.component] = out.get(f.category.component, 0) + 1
    return out


def _norm_ppf(p: float) -> float:
    """The standard normal quantile."""
    return NormalDist().inv_cdf(p)
