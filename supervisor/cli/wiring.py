"""Builds the real adapters from the daemon configuration. Wiring only: no decisions here."""

from __future__ import annotations

from pathlib import Path

from supervisor.adapters.clock import SystemClock
from supervisor.adapters.fence import CommandFencer
from supervisor.adapters.logtail import LogTail
from supervisor.adapters.slurm_cli import SlurmCli
from supervisor.adapters.sqlite_store import SqliteStore
from supervisor.config import DaemonConfig
from supervisor.domain.progress.hang import HangSettings
from supervisor.engine.progress import ProgressWatch
from supervisor.engine.reconcile import EngineSettings


def scheduler(cfg: DaemonConfig) -> SlurmCli:
    return SlurmCli(
        bin_dir=str(cfg.slurm.bin_dir) if cfg.slurm.bin_dir else None,
        slurm_conf=str(cfg.slurm.slurm_conf) if cfg.slurm.slurm_conf else None,
        timeout=cfg.slurm.command_timeout_s,
    )


def store(cfg: DaemonConfig) -> SqliteStore:
    return SqliteStore(Path(cfg.daemon.state_dir))


def engine_settings(cfg: DaemonConfig) -> EngineSettings:
    return EngineSettings(
        may_change_nodes=cfg.daemon.may_change_nodes,
        max_drains_per_hour=cfg.daemon.max_drains_per_hour,
        probe_confirm_s=cfg.probe.confirm_after_s,
    )


def clock() -> SystemClock:
    return SystemClock()


def fencer(cfg: DaemonConfig) -> CommandFencer | None:
    return CommandFencer(cfg.fence.command) if cfg.fence.command else None


def progress(cfg: DaemonConfig) -> ProgressWatch | None:
    """Hang detection from each running attempt's output file (``[hang]``)."""
    if not cfg.hang.enabled:
        return None
    settings = HangSettings(multiple=cfg.hang.multiple, floor_s=cfg.hang.floor_s, cap_s=cfg.hang.cap_s,
                            startup_grace_s=cfg.hang.startup_grace_s)
    return ProgressWatch(lambda path, at_end: LogTail(path, start_at_end=at_end), settings)
