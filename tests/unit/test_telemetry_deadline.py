"""supervisor.telemetry.deadline: the job's end, epoch seconds, from SSV_DEADLINE, else
SLURM_JOB_END_TIME (Slurm 23.02+), else one bounded `squeue -h -j JOB -o %e` (22.05 sets no
variable); a value that is not a time is refused or read as unknown, never guessed. The continue
orders (SSV_CONTINUE_SIGNAL, _EXIT_CODE, _LEAD_S) likewise. A stand-in squeue on PATH, no patching."""

from __future__ import annotations

import stat

import pytest

from supervisor.telemetry.deadline import deadline, main
from supervisor.telemetry.planned_end import EndOrders


def squeue(tmp_path, body: str) -> dict[str, str]:
    """An environment whose PATH finds only a stand-in squeue running ``body``."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    exe = bindir / "squeue"
    exe.write_text(f'#!/bin/sh\necho "$@ $SLURM_TIME_FORMAT" > {tmp_path}/argv\n{body}\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return {"PATH": str(bindir), "SLURM_JOB_ID": "4242"}


def test_ssv_deadline_wins_then_slurms_variable(tmp_path):
    env = squeue(tmp_path, "echo 1900000000")
    assert deadline({**env, "SSV_DEADLINE": "1800000000.5", "SLURM_JOB_END_TIME": "1700000000"}) == 1800000000.5
    assert deadline({**env, "SLURM_JOB_END_TIME": "1700000000"}) == 1700000000
    assert not (tmp_path / "argv").exists()  # no squeue when the environment says it


def test_slurm_22_05_asks_squeue_once_with_an_argv_and_epoch_format(tmp_path):
    env = squeue(tmp_path, "echo 1900000000")
    assert deadline(env) == 1900000000
    assert (tmp_path / "argv").read_text().split() == ["-h", "-j", "4242", "-o", "%e", "%s"]


@pytest.mark.parametrize(
    "body",
    [
        "echo Unknown",
        "echo N/A",
        "echo",
        "echo '1900000000 1900000001'",
        "yes 1 | head -c 100000",
        "sleep 30",
        "exit 1",
    ],
)
def test_an_answer_that_is_no_time_is_unknown(tmp_path, body):
    assert deadline(squeue(tmp_path, body), timeout_s=0.5) is None


def test_outside_a_job_or_without_squeue_it_is_unknown(tmp_path):
    assert deadline({"PATH": str(tmp_path)}) is None
    assert deadline({"PATH": str(tmp_path), "SLURM_JOB_ID": "4242"}) is None
    assert deadline({"PATH": str(tmp_path), "SLURM_JOB_ID": "42; rm -rf /"}) is None


@pytest.mark.parametrize("bad", ["soon", "nan", "inf", "-5", "0", "1e30"])
def test_a_deadline_that_is_no_time_is_refused(bad):
    with pytest.raises(ValueError, match="SSV_DEADLINE"):
        deadline({"SSV_DEADLINE": bad})


def test_main_prints_it_for_the_batch_script(tmp_path, capsys):
    assert main(squeue(tmp_path, "echo 1900000000")) == 0 and capsys.readouterr().out == "1900000000\n"
    assert main({"PATH": str(tmp_path)}) == 0 and capsys.readouterr().out == ""


def test_the_continue_orders_from_the_environment():
    orders = EndOrders.from_env(
        {
            "SSV_CONTINUE_SIGNAL": "USR2",
            "SSV_CONTINUE_EXIT_CODE": "80",
            "SSV_CONTINUE_LEAD_S": "300",
            "SSV_DEADLINE": "1000",
        }
    )
    assert (orders.signal_name, orders.exit_code, orders.lead_s, orders.deadline) == ("SIGUSR2", 80, 300.0, 1000.0)
    assert orders.due_by_clock(699.0) is False and orders.due_by_clock(700.0) is True
    assert EndOrders.from_env({}).exit_code == 75 and not EndOrders.from_env({}).due_by_clock(1e12)
    for bad in ({"SSV_CONTINUE_SIGNAL": "BOGUS"}, {"SSV_CONTINUE_EXIT_CODE": "300"}, {"SSV_CONTINUE_LEAD_S": "-1"}):
        with pytest.raises(ValueError, match="SSV_CONTINUE"):
            EndOrders.from_env(bad)
