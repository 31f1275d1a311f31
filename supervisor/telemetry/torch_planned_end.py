"""A PyTorch loop that ends on purpose before its time limit: save at the step boundary, commit,
exit with the continue code (docs/trainer-integration.md, *Ending before the time limit*).

    ssv = Supervision(root, run="run42")
    with EndOnPurpose(ssv, state) as end:             # holds SSV_CONTINUE_SIGNAL from here
        while step < total:
            step += 1
            ...forward, backward, all-reduce, optimizer.step()...
            state["progress"]["step"] = step
            ssv.log(step, ...)
            if step % every == 0:
                ssv.save(state, step)
            end.boundary(step)                        # every rank: one tiny all-reduce
    # EndedOnPurpose leaves the block: sys.exit(exc.exit_code) - the supervisor continues the run

``boundary(step)`` ends the job when any rank caught the signal, or the job's own clock is within
``SSV_CONTINUE_LEAD_S`` of ``SSV_DEADLINE``: it saves ``step`` with ``Supervision.save`` (DCP, a
barrier, the manifest commit) unless this job saved that step already, and raises
``EndedOnPurpose``. The ranks agree (a MAX all-reduce of each one's flag), so all of them save the
same step: clocks and signal delivery differ between nodes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist

from supervisor.telemetry.planned_end import EndOrders, SignalLatch
from supervisor.telemetry.torch import Supervision


class EndedOnPurpose(Exception):  # noqa: N818 - not an error: the job's planned end
    """The job ended before its limit after ``step`` was saved and committed; exit ``exit_code``.
    ``saved``: this call wrote it (False: the step's periodic save was it). Not a RuntimeError,
    so ``torch_survivors.SaveOnFailure`` lets it through unchanged."""

    def __init__(self, step: int, location: str, exit_code: int, why: str, *, saved: bool) -> None:
        super().__init__(f"step {step}: {why}; saved at {location}")
        self.step, self.location, self.exit_code, self.why, self.saved = step, location, exit_code, why, saved


class EndOnPurpose:
    """The guard (module docstring). ``orders``: default ``EndOrders.from_env()``; ``clock``: epoch
    seconds, for the deadline (tests pass their own)."""

    def __init__(
        self,
        ssv: Supervision,
        state: dict[str, Any],
        *,
        orders: EndOrders | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ssv, self.state = ssv, state
        self.orders = EndOrders.from_env() if orders is None else orders
        self.clock = clock
        self.latch = SignalLatch(self.orders.signal)

    def __enter__(self) -> EndOnPurpose:
        self.latch.install()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.latch.restore()

    def boundary(self, step: int) -> None:
        """Call after step ``step`` is complete (its update in ``state``), on every rank."""
        why = self._why()
        if not _any_rank(why is not None):
            return
        why = why or "another rank was told to end"
        saved = self.ssv.last_saved
        if saved is not None and saved[0] == step:
            raise EndedOnPurpose(step, saved[1], self.orders.exit_code, why, saved=False)
        location = self.ssv.save(self.state, step)
        raise EndedOnPurpose(step, location, self.orders.exit_code, why, saved=True)

    def _why(self) -> str | None:
        if self.latch.caught:
            return f"{self.orders.signal_name} before the time limit"
        if self.orders.due_by_clock(self.clock()):
            return f"{self.orders.lead_s:g} s before the deadline {self.orders.deadline:.0f}"
        return None


def _any_rank(mine: bool) -> bool:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return mine
    flag = torch.tensor([1 if mine else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())
