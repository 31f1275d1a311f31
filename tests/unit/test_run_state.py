import pytest

from supervisor.domain.run import TRANSITIONS, IllegalTransition, RunState, transition


@pytest.mark.parametrize("source", list(RunState))
def test_every_state_has_a_row(source):
    assert source in TRANSITIONS


@pytest.mark.parametrize("source", [s for s in RunState if s.terminal])
def test_terminal_states_go_nowhere(source):
    for target in RunState:
        if target is not source:
            with pytest.raises(IllegalTransition, match="terminal"):
                transition("r", source, target)


def test_allowed_and_illegal():
    assert transition("r", RunState.RUNNING, RunState.RECOVERING) is RunState.RECOVERING
    assert transition("r", RunState.RUNNING, RunState.RUNNING) is RunState.RUNNING
    with pytest.raises(IllegalTransition, match="recovering -> registered"):
        transition("r", RunState.RECOVERING, RunState.REGISTERED)
