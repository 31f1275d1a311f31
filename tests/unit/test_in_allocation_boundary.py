"""In-allocation mode: a degraded node of the step (a straggler, a throttling GPU) dropped at a
checkpoint boundary is swapped for a hot spare in the same job, not resubmitted."""

from dataclasses import replace

from test_in_allocation import JOB, of, run, snap

from supervisor.domain.actions import Cancel, ChangeNode, SwapStep
from supervisor.domain.cluster import NodeChange
from supervisor.domain.decide.policy import Observation, Policy, decide

SLOW = {"n2": (50.0, "straggler: 1.40x the median step time")}


def test_a_straggler_is_swapped_out_at_the_checkpoint_boundary_in_the_same_job():
    d = decide(run(deferred=SLOW), Observation(snap(), checkpoint_at={"llm": 90.0}), Policy())
    (swap,) = of(d, SwapStep)
    assert (swap.generation, swap.nodes, swap.out, swap.into) == (1, ("n1", "n3"), ("n2",), ("n3",))
    assert "checkpoint boundary" in swap.reason and "straggler" in swap.reason
    assert NodeChange.DRAIN in [c.change for c in of(d, ChangeNode) if c.node == "n2"]
    assert not of(d, Cancel)


def test_before_a_checkpoint_newer_than_the_finding_the_straggler_stays():
    d = decide(run(deferred=SLOW), Observation(snap(), checkpoint_at={"llm": 40.0}), Policy())
    assert not of(d, SwapStep) and not of(d, Cancel)


def test_without_a_spare_the_boundary_drop_resubmits_as_before():
    job = replace(JOB, nodes=("n1", "n2"))  # the spare is gone
    d = decide(run(deferred=SLOW), Observation(snap(job=job), checkpoint_at={"llm": 90.0}), Policy())
    assert not of(d, SwapStep) and of(d, Cancel)
