"""The launcher in the run's batch script, simulated (in-allocation mode: docs/in-allocation.md).

It behaves as ``supervisor/agent/launcher.py`` does on a real cluster: at the job's start it runs
the training step (generation 0) on the first ``nodes`` of the allocation without asking anyone;
it reports its step to the daemon and reads the step's goal through the same store methods the
launcher channel uses (``launcher_reported``, ``step_goal``, answered by ``goal_answer``); when
the goal's generation is newer it stops the step and starts the new one on the goal's nodes with
the goal's resume environment. A step that dies waits ``launcher_wait_s`` for a new generation,
then the batch script exits with its code (the job ends FAILED, as without the supervisor).

The real launcher polls every second; the simulation polls just before and just after each engine
tick (so the daemon always hears it within ``launcher_timeout_s``, and a goal written by a tick is
read at once) and charges the poll's lag to the relaunch (``launcher_poll_s``). A launcher whose
batch host is dead says nothing any more (measured: the job stays RUNNING without its script).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from supervisor.adapters.web.launcher_channel import goal_answer
from supervisor.domain.alloc_step import LauncherReport, initial_nodes
from supervisor.ports import StepLedger
from supervisor.sim.slurm.records import Incarnation
from supervisor.sim.training.trainer import Attempt

if TYPE_CHECKING:
    from supervisor.sim.training.world import World

STEP_FAILED = 1  # the exit code of a step whose processes died


@dataclass(frozen=True)
class LaunchedStep:
    """The step the launcher of one job incarnation runs now."""

    job_id: int
    restart_count: int
    allocation: tuple[str, ...]  # the job's nodes when it started; the first is the batch host
    generation: int
    nodes: tuple[str, ...]
    attempt: Attempt
    env: dict[str, str]  # the job's environment (the launcher inherits it)
    exit_code: int | None = None

    @property
    def host(self) -> str:
        return self.allocation[0]


class SimLauncher:
    def __init__(self, world: World) -> None:
        self.world = world
        self.step: LaunchedStep | None = None
        self._ledger: StepLedger | None = None
        self._run = ""

    def attach(self, ledger: StepLedger, run: str) -> None:
        """The daemon's store and the run this launcher reports for."""
        self._ledger, self._run = ledger, run

    def job_started(self, inc: Incarnation, env: dict[str, str]) -> None:
        nodes = initial_nodes(inc.nodes, self.world.settings.nodes_per_job)
        a = self.world.run_attempt((inc.job_id, inc.restart_count, 0), nodes, env)
        self.step = LaunchedStep(inc.job_id, inc.restart_count, inc.nodes, 0, nodes, a, env)

    def job_ended(self, inc: Incarnation) -> None:
        st = self.step
        if st is not None and (st.job_id, st.restart_count) == (inc.job_id, inc.restart_count):
            self.step = None

    def step_exited(self, a: Attempt) -> None:
        """The step's processes died: report it, and wait a while for a new generation."""
        st = self.step
        if st is None or st.attempt is not a:
            return
        self.step = replace(st, exit_code=STEP_FAILED)
        self.world.clock.call_later(self.world.settings.launcher_wait_s, self._give_up, self.step)

    def poll(self) -> None:
        """One round trip to the daemon: report the step, adopt a newer goal."""
        st = self.step
        if st is None or self._ledger is None or not self._host_alive(st):
            return
        now = self.world.clock.now()
        alive = st.exit_code is None
        report = LauncherReport(st.job_id, st.generation, alive, st.nodes, st.host, now, st.exit_code)
        self._ledger.launcher_reported(self._run, report)
        goal = goal_answer(st.job_id, self._ledger.step_goal(self._run, st.job_id))
        if goal.generation <= st.generation or not goal.nodes:
            return
        if len(goal.nodes) != len(st.nodes) or not set(goal.nodes) <= set(st.allocation):
            return  # refused, as the real launcher refuses nodes outside its allocation
        self._relaunch(st, goal.generation, tuple(goal.nodes), goal.env)

    def _relaunch(self, st: LaunchedStep, generation: int, nodes: tuple[str, ...], env: dict[str, str]) -> None:
        world = self.world
        world.stop_attempt(st.attempt)
        step_env = {**st.env, **env, "SSV_STEP_GENERATION": str(generation)}
        startup = world.settings.launcher_poll_s + world.settings.step_relaunch_s
        a = world.run_attempt((st.job_id, st.restart_count, generation), nodes, step_env, startup)
        self.step = replace(st, generation=generation, nodes=nodes, attempt=a, exit_code=None)

    def _give_up(self, st: LaunchedStep) -> None:
        """No new generation came: the batch script exits with the step's code."""
        if self.step is not st or st.exit_code is None or not self._host_alive(st):
            return
        try:
            self.world.cluster.finish_job(st.job_id, st.exit_code)
        except ValueError:
            pass  # the job ended meanwhile

    def _host_alive(self, st: LaunchedStep) -> bool:
        up, frozen = self.world.cluster.slurmd_status(st.host)
        return up or frozen
