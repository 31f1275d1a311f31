"""What a simulation is asked to simulate: the cluster, the run, the costs, detection settings."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from supervisor.sim.faults.failures import FailureModel, RepairTimes
from supervisor.sim.training.chain import ChainSettings
from supervisor.sim.training.trainer import TrainerSettings


class Mode(StrEnum):
    SUPERVISOR = "supervisor"  # the real engine supervises the run
    BASELINE = "baseline"  # plain Slurm requeue, no supervisor
    IN_ALLOCATION = "in-allocation"  # the real engine, recovering inside the job (--no-kill, hot spares)

    @property
    def supervised(self) -> bool:
        return self is not Mode.BASELINE


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
    # In-allocation mode: nodes the job holds beyond the step, warm (part of the run's idle capacity,
    # so the comparison stays fair: the rest of ``spares`` stays idle in the partition for a
    # resubmission). 16 of 2,048 nodes: Table 5's ~6 node faults a day spend them in ~2-3 days
    # (a swapped-out node leaves the job), after which the run falls back to one resubmission,
    # which brings nodes + hot_spares again; more spares buy little (one resubmission per ~2
    # days) and cost idle node-hours.
    hot_spares: int = 16
    # A swap's relaunch: the launcher's poll (<= 1 s) and a new srun step in the same job (0.1 s
    # measured, docs/in-allocation.md) plus process start and NCCL init — an assumption; no
    # queue, allocation, prolog or job start-up. The checkpoint restore comes on top (trainer).
    step_relaunch_s: float = 10.0
    launcher_poll_s: float = 1.0  # the launcher reports and reads its goal this often
    launcher_wait_s: float = 30.0  # a step that died waits this long for a new generation (launcher)
    straggler_slowdown: float = 1.3
    # The partition's time limit, the queue and preemption: a run of weeks as a chain of jobs
    # (sim.training.chain; off by default: no limit, no queue wait, no preemption).
    chain: ChainSettings = field(default_factory=ChainSettings)

    def __post_init__(self) -> None:
        problems = []
        if self.gpus_per_node < 1 or self.gpus < self.gpus_per_node or self.gpus % self.gpus_per_node:
            problems.append(f"gpus ({self.gpus}) must be a positive multiple of gpus_per_node ({self.gpus_per_node})")
        if self.spares < 0 or self.baseline_spares < 0 or self.hot_spares < 1:
            problems.append("spares must be 0 or more, hot_spares 1 or more")
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
            "step_relaunch_s",
            "launcher_poll_s",
            "launcher_wait_s",
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
        """Nodes in the partition. In-allocation: the hot spares are among the spares."""
        if mode is Mode.IN_ALLOCATION:
            return self.nodes_per_job + max(self.spares, self.hot_spares)
        return self.nodes_per_job + (self.spares if mode is Mode.SUPERVISOR else self.baseline_spares)
