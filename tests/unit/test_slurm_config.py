"""``scontrol show config`` read into the settings decisions depend on."""

from supervisor.adapters.slurm.config import has_accounting, kill_wait_s, parse_show_config

SHOWN = """\
Configuration data as of 2026-12-01T10:00:04
AccountingStorageType   = accounting_storage/none
KillWait                = 5 sec
MinJobAge               = 300 sec
SlurmctldParameters     = (null)

Cgroup Support Configuration:
"""


def test_kill_wait_and_accounting_are_read_from_scontrols_own_words():
    config = parse_show_config(SHOWN)
    assert config["MinJobAge"] == "300 sec" and config["SlurmctldParameters"] == "(null)"
    assert kill_wait_s(config) == 5.0 and not has_accounting(config)
    assert has_accounting({"AccountingStorageType": "accounting_storage/slurmdbd"})


def test_slurms_defaults_when_it_does_not_say():
    assert kill_wait_s({}) == 30.0 and kill_wait_s({"KillWait": "garbled"}) == 30.0
    assert not has_accounting({})
