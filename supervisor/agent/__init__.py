"""The node agent: one per node of a run's allocation. Reads the GPUs (NVML) and the host
(psutil), waits on XID events between samples, and sends compact report batches to the daemon's
ingest with the run's token. ``check_once`` is the one-shot read for Slurm hooks (prolog,
healthcheck): bounded in time, it cannot hang on a wedged driver.

Layer: above the adapters (it wires the NVML reader and its HTTP sender), below the CLI.
"""

from supervisor.agent.loop import Agent, AgentSettings, GpuReader
from supervisor.agent.oneshot import CheckResult, check_once
from supervisor.agent.sender import HttpSender, SenderSettings

__all__ = ["Agent", "AgentSettings", "CheckResult", "GpuReader", "HttpSender", "SenderSettings", "check_once"]
