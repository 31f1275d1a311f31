"""Ending a job on purpose before its time limit, trainer side, without torch: the orders and the
held signal. ``torch_planned_end`` (a PyTorch loop) and ``hf`` (the Trainer) build on it.

The supervisor's ``[continuation]`` puts in every job's environment ``SSV_CONTINUE_EXIT_CODE``
(the "saved, continue me" code, default 75) and, with a signal configured, ``SSV_CONTINUE_SIGNAL``
and ``SSV_CONTINUE_LEAD_S`` (Slurm sends it that long before the limit). ``SSV_DEADLINE`` (epoch
seconds, ``supervisor.telemetry.deadline``) lets the job also end on its own clock, ``lead_s``
before it. The signal is held, never acted on in its handler (Python runs a handler between any
two bytecodes, maybe halfway through ``optimizer.step()``): the loop asks at the step boundary.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any

from supervisor.telemetry.deadline import deadline

DEFAULT_CONTINUE_EXIT_CODE = 75  # EX_TEMPFAIL; the supervisor's default, docs/configuration.md


@dataclass(frozen=True)
class EndOrders:
    """How this job ends on purpose: the signal to hold (None: none), the exit code that says
    "saved, continue me", the deadline (epoch seconds, None: unknown) and how long before it to
    end on the job's own clock (None: not on the clock)."""

    signal: signal.Signals | None = None
    exit_code: int = DEFAULT_CONTINUE_EXIT_CODE
    deadline: float | None = None
    lead_s: float | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> EndOrders:
        """From the environment; never runs squeue (the batch script exports ``SSV_DEADLINE``)."""
        env = os.environ if env is None else env
        return cls(
            signal=_signal(env.get("SSV_CONTINUE_SIGNAL", "")),
            exit_code=_exit_code(env.get("SSV_CONTINUE_EXIT_CODE", "")),
            deadline=deadline(env, ask_squeue=False),
            lead_s=_lead(env.get("SSV_CONTINUE_LEAD_S", "")),
        )

    @property
    def signal_name(self) -> str | None:
        return self.signal.name if self.signal is not None else None

    def due_by_clock(self, now: float) -> bool:
        """Whether ``now`` is within ``lead_s`` of the deadline (False when either is unknown)."""
        return self.deadline is not None and self.lead_s is not None and now >= self.deadline - self.lead_s


def _signal(text: str) -> signal.Signals | None:
    if not text:
        return None
    name = text.strip().upper().removeprefix("SIG")
    try:
        return signal.Signals(int(name)) if name.isdigit() else signal.Signals["SIG" + name]
    except (KeyError, ValueError):
        raise ValueError(f"SSV_CONTINUE_SIGNAL={text[:20]!r}: not a signal (USR1, USR2, TERM or a number)") from None


def _exit_code(text: str) -> int:
    if not text:
        return DEFAULT_CONTINUE_EXIT_CODE
    if not text.isdigit() or not 1 <= int(text) <= 255:
        raise ValueError(f"SSV_CONTINUE_EXIT_CODE={text[:20]!r}: expected 1-255")
    return int(text)


def _lead(text: str) -> float | None:
    if not text:
        return None
    if not text.isdigit() or int(text) > 86_400:
        raise ValueError(f"SSV_CONTINUE_LEAD_S={text[:20]!r}: expected whole seconds 0-86400")
    return float(text)


class SignalLatch:
    """The continuation signal, held: the handler only notes it; ``caught`` is read at a step
    boundary. ``install()`` in the main thread (elsewhere Python allows no handler: nothing is
    installed), ``restore()`` puts the previous handler back."""

    def __init__(self, signum: signal.Signals | None) -> None:
        self.signum = signum
        self.caught = False
        self._previous: Any = None
        self._installed = False

    def install(self) -> None:
        if self.signum is None or self._installed or threading.current_thread() is not threading.main_thread():
            return
        self._previous = signal.signal(self.signum, self._note)
        self._installed = True

    def restore(self) -> None:
        if self._installed and self.signum is not None:
            signal.signal(self.signum, self._previous)
            self._installed = False

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.caught = True
