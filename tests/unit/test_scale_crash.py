"""A node crash in a 2,048-node run is recovered with the same logbook as in a 4-node run (issue 14):
the same kinds of entries in the same order, the same evidence (node names and job ids aside)."""

from __future__ import annotations

import re

from unit.sim_world import SimWorld

from supervisor.domain.records import EventKind
from supervisor.domain.run import RunSpec, SparePolicy

NODE_LIST = re.compile(r"n\d{3,4}(,n\d{3,4})*|n\[[\d,-]+\] \(\d+ nodes\)")  # a few by name, more as a hostlist
JOB = re.compile(r"job \d+")
SECONDS = re.compile(r"\d+\.\d s")


def crash_logbook(tmp_path, job_nodes: int) -> list[tuple[EventKind, str]]:
    total = job_nodes + 2
    width = max(3, len(str(total)))
    spare = f"n{total:0{width}d}"
    spec = RunSpec(
        name="llm",
        script="/train.sbatch",
        partition="main",
        nodes=job_nodes,
        spare_policy=SparePolicy.NAMED,
        spare_nodes=(spare,),
        max_restarts=5,
    )
    w = SimWorld(tmp_path / str(job_nodes), spec, nodes=total)
    w.until(w.running)
    crashed_at = w.clock.now()
    w.cluster.crash_node(w.job().nodes[job_nodes // 2])
    w.until(lambda: w.running() and w.run().attempt.seq == 1)
    assert w.clock.now() - crashed_at < 10.0
    return [
        (e.kind, SECONDS.sub("S", JOB.sub("job J", NODE_LIST.sub("NODES", e.message))))
        for e in w.store.events("llm")
        if e.kind is not EventKind.ADOPTED
    ]


def test_a_crash_at_2048_nodes_reads_like_a_crash_at_4(tmp_path):
    small = crash_logbook(tmp_path, 2)
    large = crash_logbook(tmp_path, 2048)
    assert [k for k, _ in large] == [k for k, _ in small]
    assert large == small
    evidence = dict(small)[EventKind.FAULT]
    assert "slurmd probe failed 2 times" in evidence and "ECONNREFUSED" in evidence
