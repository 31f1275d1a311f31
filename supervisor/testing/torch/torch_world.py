"""examples/torch/train.py as a local gloo world, no Slurm: N processes on this host, each told the
node it plays (``SLURMD_NODENAME`` n1, n2..: ``per_node`` consecutive ranks a node, as torchrun
numbers them), for the trainer-side tests of save on failure and peer copies; and the tensors of a
DCP checkpoint, read back in this process to compare two runs' states."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.testing.torch.torchrun import EXAMPLE, TorchRun


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LocalWorld:
    """``ranks`` train.py processes in ``workdir``, ``per_node`` to a node; each rank's output in
    ``workdir/NAME-RANK.log``, rank 0's trace in ``workdir/NAME.jsonl``."""

    workdir: Path
    name: str
    args: Sequence[str]
    ranks: int = 2
    per_node: int = 1
    env: Mapping[str, str] = field(default_factory=dict)
    nodes: Sequence[str] = ()  # the nodes' names in rank order (default n1, n2..)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def trace(self) -> Path:
        return self.workdir / f"{self.name}.jsonl"

    def log(self, rank: int) -> str:
        return (self.workdir / f"{self.name}-{rank}.log").read_text()

    def start(self) -> LocalWorld:
        data = self.workdir / "corpus.bin"
        if not data.exists():
            TorchRun(self.workdir, "none", "unused").write_corpus()
        port = str(free_port())
        for rank in range(self.ranks):
            env = {
                **os.environ,
                **self.env,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank % self.per_node),
                "WORLD_SIZE": str(self.ranks),
                "LOCAL_WORLD_SIZE": str(self.per_node),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
                "GLOO_SOCKET_IFNAME": "lo",
                "OMP_NUM_THREADS": "1",
                "SLURMD_NODENAME": self.node(rank),
            }
            argv = [sys.executable, str(EXAMPLE / "train.py"), "--data", str(data), "--trace", str(self.trace)]
            with (self.workdir / f"{self.name}-{rank}.log").open("w") as out:
                proc = subprocess.Popen([*argv, *self.args], env=env, stdout=out, stderr=subprocess.STDOUT)
            self.procs.append(proc)
        return self

    def node(self, rank: int) -> str:
        index = rank // self.per_node
        return self.nodes[index] if self.nodes else f"n{index + 1}"

    def wait(self, timeout: float = 180.0) -> list[int]:
        """Every rank's exit code (negative: the signal that ended it)."""
        return [p.wait(timeout=timeout) for p in self.procs]

    def run(self, timeout: float = 180.0) -> list[int]:
        return self.start().wait(timeout)

    def steps_traced(self) -> int:
        return sum(1 for _ in self.trace.open()) if self.trace.exists() else 0

    def kill_node(self, node: str, when: Callable[[], bool], timeout: float = 120.0) -> None:
        """SIGKILL every rank of ``node`` once ``when()`` holds: the node crashed."""
        deadline = time.monotonic() + timeout
        while not when():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise AssertionError(f"{self.name}: the moment to kill {node} never came")
            time.sleep(0.005)
        for rank, proc in enumerate(self.procs):
            if self.node(rank) == node:
                proc.kill()


def dcp_tensors(location: Path) -> dict[str, Any]:
    """Every tensor of the DCP checkpoint at ``location``, whole (however it was sharded), by its
    flattened name."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = location.parent / f"{location.name}.pt"
    dcp_to_torch_save(str(location), str(out))
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)
        elif isinstance(value, torch.Tensor):
            flat[prefix] = value

    walk("", torch.load(out, weights_only=False))
    out.unlink()
    return flat
