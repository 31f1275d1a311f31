"""Exit codes as a table of meanings: what a trainer's exit code asks of the supervisor. Pure.

The defaults, lowest precedence first (docs/configuration.md, "Exit codes"):

* Megatron-LM's result validation: 16 (``EXIT_CODE_RESUME_TO_DISAMBIGUATE``: run again on other
  hardware to tell a transient fault from a real one) restarts with the attempt's nodes kept out;
  17 (``EXIT_CODE_FAILED_ON_RESULT_VALIDATION``) stops;
* ``[restart] do_not_restart_exit_codes`` stop (default ``[93]``, nvidia-resiliency-ext's "do not
  requeue");
* the continue code (``[continuation] exit_code``, 75 without the section) continues;
* ``[restart.exit_codes]``, the run's own map, over all of them.

Any other non-zero code restarts. The policy asks ``meaning_of``; no decision compares numbers.
"""

from __future__ import annotations

from collections.abc import Mapping

from supervisor.domain.actions import Decision, Exclude, SetState
from supervisor.domain.cluster import JobInfo
from supervisor.domain.observation import Observation, event_for, fmt_nodes
from supervisor.domain.records import AttemptRecord, EventKind, RunRecord
from supervisor.domain.run import DEFAULT_CONTINUE_EXIT_CODE, ExitMeaning, RunSpec, RunState

MEGATRON_RESUME_TO_DISAMBIGUATE = 16
MEGATRON_FAILED_ON_RESULT_VALIDATION = 17

BUILT_IN: Mapping[int, ExitMeaning] = {
    MEGATRON_RESUME_TO_DISAMBIGUATE: ExitMeaning.RESTART_ELSEWHERE,
    MEGATRON_FAILED_ON_RESULT_VALIDATION: ExitMeaning.STOP,
}


def continue_code(spec: RunSpec) -> int:
    return spec.continuation.exit_code if spec.continuation is not None else DEFAULT_CONTINUE_EXIT_CODE


def exit_table(spec: RunSpec) -> dict[int, ExitMeaning]:
    """Every exit code with a meaning other than "restart" for this run, and the run's own overrides."""
    table = dict(BUILT_IN)
    table.update(dict.fromkeys(spec.do_not_restart_exit_codes, ExitMeaning.STOP))
    table[continue_code(spec)] = ExitMeaning.CONTINUE
    table.update(spec.exit_codes)
    return table


def meaning_of(spec: RunSpec, exit_code: int | None) -> ExitMeaning | None:
    """What the code asks for; None for no code (killed by a signal, or not known) and for 0."""
    if not exit_code:
        return None
    return exit_table(spec).get(exit_code, ExitMeaning.RESTART)


def run_elsewhere(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation) -> Decision:
    """The trainer asks to run again on other nodes (Megatron's 16: a result that did not validate
    may be the hardware's fault or the run's): one fault, the attempt's nodes kept out of this run —
    not drained, nothing is proven against them — and the restart elsewhere tells the two apart."""
    nodes = a.nodes or job.nodes
    why = (
        f"job {job.job_id} exited with code {job.exit_code}: run again on other nodes to tell a transient fault "
        f"from a real one; {fmt_nodes(nodes)} kept out of this run (not drained)"
    )
    kept_out = tuple(Exclude(run.name, n, f"exit code {job.exit_code} on it: run elsewhere") for n in nodes)
    evidence = {"state": job.state.value, "exit_code": job.exit_code, "meaning": ExitMeaning.RESTART_ELSEWHERE.value}
    fault = event_for(run, a, EventKind.FAULT, why, obs, {**evidence, "nodes": list(nodes)})
    return Decision((*kept_out, fault, SetState(run.name, RunState.RECOVERING, reason=why)))
