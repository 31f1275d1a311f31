"""What a simulation is asked to simulate: the cluster, the run, the costs, detection settings."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from supervisor.sim.failures import FailureModel, RepairTimes
from supervisor.sim.trainer import TrainerSettings


class Mode(StrEnum):
    SUPERVISOR = "supervisor"  # the real engine supervises the run
    BASELINE = "baseline"  # plain Slurm requeue, no supervisor


@dataclass(frozen=True)
class SimSettings:
    gpus: int = 16384  # GPUs the run's job uses
    gpus_per_node: int = 8
    spares: int = 64  # named spare nodes the supervisor may use (supervisor mode)
    baseline_spares: int = 0  # idle nodes in the partition in baseline mode (none: "no spares")
    days: float = 54.0
    seed: int = 0
    trainer: TrainerSettings = field(default_factory=TrainerSettings)
    failures: FailureModel = field(default_factory=FailureModel)
    repair: RepairTimes = field(default_factory=RepairTimes)
    poll_interval_s: float = 5.0  # the daemon's poll grid
    hang_multiple: float = 5.0
    probe_confirm_s: float = 1.0
    nccl_timeout_s: float = 600.0  # NCCL's watchdog kills a hung job (torch default: 10 min)
    slurmd_timeout_s: float = 300.0  # Slurm's SlurmdTimeout: a silent node goes DOWN
    health_check_s: float = 300.0  # Slurm's HealthCheckInterval (NHC drains nodes with a bad GPU/NIC)
    agent_sample_s: float = 10.0  # the node agent's sample interval (SimHealthFeed)
    cred_expire_s: float = 120.0  # a requeued job may start again after this
    max_skip_s: float = 6 * 3600.0  # quiet ticks skipped at most this long (bounds log backlogs)
    # Supervisor mode: the engine reads the node agents' findings (SimHealthFeed): a faulty GPU is
    # drained at once, and a repaired node rejoins (node_returned). False: GPU faults surface only
    # through the job's death and Slurm's periodic health check (NHC).
    node_agents: bool = True
    skip_quiet_ticks: bool = True  # False: tick on every poll like the daemon (slow; for checking)
    max_drains_per_hour: int = 8
    straggler_slowdown: float = 1.3

    def __post_init__(self) -> None:
        problems = []
        if self.gpus_per_node < 1 or self.gpus < self.gpus_per_node or self.gpus % self.gpus_per_node:
            problems.append(f"gpus ({self.gpus}) must be a positive multiple of gpus_per_node ({self.gpus_per_node})")
        if self.spares < 0 or self.baseline_spares < 0:
            problems.append("spares must be 0 or more")
        if not (math.isfinite(self.days) and self.days > 0):
            problems.append(f"days must be positive (got {self.days})")
        for name in (
            "poll_interval_s",
            "nccl_timeout_s",
            "slurmd_timeout_s",
            "health_check_s",
            "agent_sample_s",
            "max_skip_s",
            "hang_multiple",
        ):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                problems.append(f"{name} must be a positive number (got {getattr(self, name)!r})")
        if problems:
            raise ValueError("simulation settings: " + "; ".join(problems))

    @property
    def nodes_per_job(self) -> int:
        return self.gpus // self.gpus_per_node

    @property
    def seconds(self) -> float:
        return self.days * 86400.0

    def pool(self, mode: Mode) -> int:
        return self.nodes_per_job + (self.spares if mode is Mode.SUPERVISOR else self.baseline_spares)
