"""``[continuation]`` and ``[restart.exit_codes]`` in the run spec file (issue 31), the exit-code
table they make, and the spec's way through the store."""

from __future__ import annotations

import pytest
from test_config import MINIMAL_RUN, spec_in

from supervisor.adapters.sqlite import SqliteStore
from supervisor.config import ConfigError, load_run_spec
from supervisor.domain.decide.exit_codes import exit_table, meaning_of
from supervisor.domain.run import ContinuationPolicy, ExitMeaning

CONTINUATION = """
[continuation]
signal = "SIGUSR2"
lead_s = 900
exit_code = 42
target_step = 500000
max_without_progress = 2

[restart.exit_codes]
"16" = "restart"
"93" = "restart-elsewhere"
"""


def test_the_continuation_section_and_the_exit_code_map_load(tmp_path):
    spec = load_run_spec(spec_in(tmp_path, MINIMAL_RUN + CONTINUATION))
    assert spec.continuation == ContinuationPolicy(
        signal="USR2", lead_s=900, exit_code=42, target_step=500000, max_without_progress=2
    )
    assert spec.exit_codes == {16: ExitMeaning.RESTART, 93: ExitMeaning.RESTART_ELSEWHERE}
    assert meaning_of(spec, 42) is ExitMeaning.CONTINUE and meaning_of(spec, 16) is ExitMeaning.RESTART
    assert meaning_of(spec, 17) is ExitMeaning.STOP and meaning_of(spec, 1) is ExitMeaning.RESTART


def test_the_default_table_without_the_sections(tmp_path):
    spec = load_run_spec(spec_in(tmp_path, MINIMAL_RUN))
    assert spec.continuation is None
    assert exit_table(spec) == {
        16: ExitMeaning.RESTART_ELSEWHERE,  # Megatron-LM: run again on other hardware to disambiguate
        17: ExitMeaning.STOP,  # Megatron-LM: failed result validation
        93: ExitMeaning.STOP,  # nvidia-resiliency-ext: do not requeue
        75: ExitMeaning.CONTINUE,  # the continue code
    }
    assert meaning_of(spec, 0) is None and meaning_of(spec, None) is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[continuation]\nsignal = "KILL9"\n', "signal"),
        ("[continuation]\nlead_s = 10\n", "continuation.lead_s"),
        ('[restart.exit_codes]\n"300" = "stop"\n', "300"),
        ('[restart.exit_codes]\n"16" = "maybe"\n', "restart.exit_codes"),
    ],
)
def test_bad_values_name_the_key(tmp_path, text, says):
    with pytest.raises(ConfigError) as caught:
        load_run_spec(spec_in(tmp_path, MINIMAL_RUN + text))
    assert says in str(caught.value)


def test_the_spec_survives_the_store(tmp_path):
    spec = load_run_spec(spec_in(tmp_path, MINIMAL_RUN + CONTINUATION))
    store = SqliteStore(tmp_path / "state")
    store.add_run(spec, 0.0)
    assert store.get_run(spec.name).spec == spec
