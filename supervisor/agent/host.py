"""The host's side of a report: memory pressure, CPU, load (psutil)."""

from __future__ import annotations

import os

import psutil

from supervisor.domain.health.node_report import HostSample


def read_host() -> HostSample:
    """Never raises: what cannot be read is left out."""
    mem = swap = cpu = load = None
    try:
        mem = psutil.virtual_memory()
    except OSError:
        pass
    try:
        swap = psutil.swap_memory()
    except OSError:
        pass
    try:
        cpu = psutil.cpu_percent(interval=None)  # since the previous call: one sample interval
    except OSError:
        pass
    try:
        load = os.getloadavg()[0]
    except OSError:
        pass
    return HostSample(
        mem_used_pct=round(float(mem.percent), 1) if mem is not None else None,
        mem_avail_mb=int(mem.available // (1 << 20)) if mem is not None else None,
        swap_used_pct=round(float(swap.percent), 1) if swap is not None and swap.total else None,
        cpu_pct=round(float(cpu), 1) if cpu is not None else None,
        load1=round(load, 2) if load is not None else None,
    )
