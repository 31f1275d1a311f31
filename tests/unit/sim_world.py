"""The engine harness on the simulated cluster: what the engine tests share.

``supervisor.testing.kit.engine.EngineHarness`` builds the engine and owns its life. It lives in the
``testing`` layer, which may import neither the simulator (a layer above) nor the adapters (its
sibling), so this module hands it the concrete parts: a ``VirtualClock``, a ``SimCluster`` (its
keyword arguments pass through) and its ``SimProbe``, a ``SqliteStore`` on the state directory and,
with ``watch_checkpoints``, a ``MemoryCheckpointStore``; and adds what only a simulator answers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memory_checkpoints import MemoryCheckpointStore

from supervisor.adapters.sqlite import SqliteStore
from supervisor.domain.run import RunSpec
from supervisor.sim.clock import VirtualClock
from supervisor.sim.slurm.cluster import SimCluster
from supervisor.sim.slurm.probe import SimProbe
from supervisor.testing.kit.engine import EngineHarness

CLUSTER_OPTIONS = ("slurmd_timeout", "down_after", "node_rights")


class SimWorld(EngineHarness[SimCluster]):
    """``SimWorld(tmp_path, SPEC, ..., nodes=4, probe=True, node_rights=False, settings=..., hang=...)``:
    the runs' specs, then the cluster's options (``CLUSTER_OPTIONS``), the rest for the harness.
    ``clock``: when a collaborator built beforehand needs it (a health feed)."""

    def __init__(
        self,
        state_dir: Path,
        *specs: RunSpec,
        nodes: int = 4,
        probe: bool = True,
        watch_checkpoints: bool = False,
        clock: VirtualClock | None = None,
        **options: Any,
    ) -> None:
        cluster_options = {k: options.pop(k) for k in CLUSTER_OPTIONS if k in options}
        clock = clock or VirtualClock()
        self.cluster = SimCluster(clock, nodes, "main", **cluster_options)
        super().__init__(
            state_dir,
            clock=clock,
            scheduler=self.cluster,
            open_store=SqliteStore,
            specs=specs,
            probe=SimProbe(self.cluster) if probe else None,
            view=self.cluster.inspect,
            ckpt=MemoryCheckpointStore(clock) if watch_checkpoints else None,
            **options,
        )

    def submitted_env(self, n: int = -1) -> dict[str, str]:
        """The environment of the ``n``-th job submitted (the newest by default)."""
        submits = [args[0] for name, *args in self.cluster.calls if name == "submit"]
        return dict(submits[n].env)

    def run_overlaps(self) -> list[tuple[Any, Any]]:
        """Pairs of the run's incarnations that ran at the same time (there must be none)."""
        log = self.cluster.incarnation_log
        return [(a, b) for i, a in enumerate(log) for b in log[i + 1 :] if a.overlaps(b)]
