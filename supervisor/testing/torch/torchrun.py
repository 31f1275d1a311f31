"""The PyTorch example (examples/torch/) as a supervised run on a LocalSlurm, for tests and benches.

``TorchRun`` writes the run spec (the example's batch script, the torchrun settings a one-host
cluster needs, checkpoints on a directory or an S3 server) and reads back what the trainer did:
its trace (one line per step, trained or skipped) and its telemetry.
"""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.testing.slurm.daemon import write_run

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "torch"
SAMPLE_BYTES = 33  # seq_len 32 + 1: bytes per sample with the example's default --seq-len


@dataclass
class TorchRun:
    """One run of examples/torch/train.py: ``spec()`` writes it, ``trace()`` reads what it did."""

    workdir: Path
    partition: str
    root: str  # a directory or s3://bucket/prefix/
    name: str = "gpt"
    nodes: int = 2
    spares: str | None = None
    train_args: Sequence[str] = ()
    storage_env: Mapping[str, str] = field(default_factory=dict)  # S3 credentials, AWS_ENDPOINT_URL
    endpoint_url: str | None = None
    script: str = "train.sbatch"  # or train_launch.sbatch: in-allocation mode's launcher
    nproc: int = 1  # ranks per node (TRAIN_NPROC)

    @property
    def trace_path(self) -> Path:
        return self.workdir / "trace.jsonl"

    @property
    def data_path(self) -> Path:
        return self.workdir / "corpus.bin"

    def spec(self, checkpoints: str = "", spikes: str = "", restart: str = "", max_restarts: int = 3) -> Path:
        """The batch script and run spec; ``checkpoints`` / ``spikes`` / ``restart``: extra lines of
        those sections."""
        args = ["--root", self.root, "--data", str(self.data_path), "--trace", str(self.trace_path), *self.train_args]
        env = {
            "TRAIN_DIR": str(EXAMPLE),
            "TRAIN_PYTHON": sys.executable,
            "TRAIN_ARGS": " ".join(args),
            "MASTER_ADDR": "127.0.0.1",  # every LocalSlurm node is this host
            "GLOO_SOCKET_IFNAME": "lo",
            "OMP_NUM_THREADS": "1",
            "TRAIN_NPROC": str(self.nproc),
            **self.storage_env,
        }
        body = (EXAMPLE / self.script).read_text().split("\n", 1)[1]
        spec = write_run(
            self.workdir,
            self.name,
            nodes=self.nodes,
            partition=self.partition,
            spares=self.spares,
            script_body=body,
            env=env,
            max_restarts=max_restarts,
        )
        endpoint = f'endpoint_url = "{self.endpoint_url}"\n' if self.endpoint_url else ""
        with spec.open("a") as f:
            f.write(restart)  # write_run's [restart] section is the last one it writes
            f.write(f'[checkpoints]\nroot = "{self.root}"\n{endpoint}scan_interval_s = 1\n{checkpoints}')
            if spikes:
                f.write(f"[spikes]\n{spikes}")
        return spec

    def trace(self) -> list[dict[str, Any]]:
        if not self.trace_path.exists():
            return []
        return [json.loads(line) for line in self.trace_path.read_text().splitlines() if line.strip()]

    def trained(self, attempt: int, generation: int | None = None) -> list[dict[str, Any]]:
        """The steps an attempt (and a generation of its step, in-allocation) trained on (not the
        ones it skipped), in order."""
        return [
            e
            for e in self.trace()
            if e.get("attempt") == str(attempt)
            and not e.get("skipped")
            and (generation is None or e.get("generation") == str(generation))
        ]

    def write_corpus(
        self, n_bytes: int = 1 << 19, poison: tuple[int, int] | None = None, global_batch: int = 16
    ) -> None:
        """The example's corpus; with ``poison=(first, last)``, batches first..last corrupted: a
        growing share of their bytes (40 % at ``first``, all at ``last``) replaced by random
        bytes, so the loss jumps and keeps climbing while they are trained on. The example's
        layout: batch s is samples (s-1)*G .. s*G-1, sample i the SAMPLE_BYTES bytes from i*SAMPLE_BYTES."""
        text = bytearray(_example().make_text(n_bytes))
        if poison is not None:
            rng = random.Random(7)
            first, last = poison
            per_batch = global_batch * SAMPLE_BYTES
            assert last * per_batch <= len(text), "the corpus must hold the poisoned batches without wrapping"
            for batch in range(first, last + 1):
                share = 0.4 + 0.6 * (batch - first) / max(last - first, 1)
                for offset in range((batch - 1) * per_batch, batch * per_batch):
                    if rng.random() < share:
                        text[offset] = rng.randrange(256)
        self.data_path.write_bytes(bytes(text))


def _example() -> Any:
    """examples/torch/train.py as a module (it is not part of the package)."""
    loaded = importlib.util.spec_from_file_location("ssv_example_torch_train", EXAMPLE / "train.py")
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    sys.modules[loaded.name] = module  # its dataclasses look their module up while being defined
    loaded.loader.exec_module(module)
    return module
