"""Which nodes a (re)submission keeps out: nodes bad for the run, and spares not yet needed."""

from __future__ import annotations

from collections.abc import Iterable

from supervisor.domain.cluster import ClusterSnapshot
from supervisor.domain.records import RunRecord
from supervisor.domain.run import SparePolicy


def exclusions_for(run: RunRecord, snapshot: ClusterSnapshot, also: Iterable[str] = ()) -> tuple[str, ...]:
    """The ``--exclude`` list for the run's next job.

    Nodes kept out of the run (faulty, degraded) and ``also`` (quarantined nodes) are always
    excluded. With named spares, the spares are excluded too, except as many idle spares as the
    run needs when the partition has too few other idle nodes.
    """
    bad = set(run.excluded) | set(run.deferred) | set(also)
    spec = run.spec
    if spec.spare_policy is not SparePolicy.NAMED or not spec.spare_nodes:
        return tuple(sorted(bad))
    spares = set(spec.spare_nodes) - bad
    in_partition = snapshot.partition_nodes(spec.partition)
    idle_regular = [n for n in in_partition if n.idle and n.name not in bad and n.name not in spares]
    shortfall = max(0, spec.nodes - len(idle_regular))
    idle_spares = sorted(n.name for n in in_partition if n.idle and n.name in spares)
    allowed = set(idle_spares[:shortfall])
    return tuple(sorted(bad | (spares - allowed)))
