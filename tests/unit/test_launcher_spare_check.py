"""The launcher's pre-flight check of the hot spares (issue 16): at start, beside generation 0's
step, one overlapping step runs the one-shot agent check on every spare; it never delays or stops
the training step, and it is bounded in time. A stand-in ``srun`` logs its argv."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import structlog
from structlog.testing import capture_logs
from test_launcher import Channel, fake_srun, run_in_thread, settings, wait

from supervisor.agent.launcher import Launcher
from supervisor.agent.oneshot import CheckResult, as_agent_report
from supervisor.agent.spare_check import SPARE_CHECK_NAME, SpareCheck, spare_check_argv
from supervisor.cli.node.launch import _spare_check
from supervisor.domain.health.node_report import ReportBatch, check_batch

CHECK = ("check", "--once", "--send")
ENDS = {f"launcher_spare_check_{end}" for end in ("done", "found_fatal", "failed", "timed_out")}


@pytest.fixture(autouse=True)
def _info_lines_logged() -> None:
    """A test before may have configured structlog to drop info lines (the CLI's --log-level):
    capture_logs would then see none of the check's outcomes."""
    structlog.reset_defaults()


def check_srun(tmp_path: Path, check_body: str) -> tuple[Path, Path]:
    """A stand-in srun: the spare check does ``check_body``, the training step sleeps."""
    marker = tmp_path / "check.pid"
    body = f'case "$*" in *{SPARE_CHECK_NAME}*) echo $$ > {marker}; {check_body};; esac\nexec sleep 30'
    return fake_srun(tmp_path, body)


def lines_of(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_the_spares_are_checked_in_one_overlapping_step_beside_generation_0(tmp_path: Path) -> None:
    srun, log = check_srun(tmp_path, "exit 0")
    launcher = Launcher(settings(srun, allocation=("n1", "n2", "n3", "n4"), spare_check=CHECK), Channel())  # type: ignore[arg-type]
    with capture_logs() as logs:
        thread, _ = run_in_thread(launcher)
        wait(lambda: len(lines_of(log)) == 2 and any(e["event"] == "launcher_spare_check_done" for e in logs))
        launcher.stopping.set()
        thread.join(5)
    step = next(line for line in lines_of(log) if SPARE_CHECK_NAME not in line)
    check = next(line for line in lines_of(log) if SPARE_CHECK_NAME in line)
    assert "--nodelist=n1,n2" in step and step.endswith("--overlap train --x")
    assert check.split(" ", 2)[2] == " ".join(spare_check_argv("srun", ("n3", "n4"), CHECK)[1:])
    assert "--overlap --nodes=2 --ntasks=2 --ntasks-per-node=1 --nodelist=n3,n4" in check
    assert check.endswith("check --once --send")
    done = next(e for e in logs if e["event"] == "launcher_spare_check_done")
    assert done["spares"] == ["n3", "n4"] and done["exit_code"] == 0


def test_a_hanging_check_neither_delays_generation_0_nor_outlives_its_timeout(tmp_path: Path) -> None:
    srun, log = check_srun(tmp_path, "exec sleep 30")
    channel = Channel()
    launcher = Launcher(settings(srun, spare_check=CHECK, spare_check_timeout_s=1.0), channel)  # type: ignore[arg-type]
    with capture_logs() as logs:
        thread, _ = run_in_thread(launcher)
        wait(lambda: any(r.alive for r in channel.reports))
        assert not any(e["event"] in ENDS for e in logs)  # still checking
        wait(lambda: any(e["event"] == "launcher_spare_check_timed_out" for e in logs))
        pid = int((tmp_path / "check.pid").read_text())
        wait(lambda: not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2])
        assert thread.is_alive() and channel.reports[-1].alive  # the training step goes on
        launcher.stopping.set()
        thread.join(5)
    assert len([line for line in lines_of(log) if SPARE_CHECK_NAME not in line]) == 1


def test_a_check_that_finds_a_fatal_spare_or_fails_is_logged_and_the_launcher_goes_on(tmp_path: Path) -> None:
    srun, _ = check_srun(tmp_path, "exit 2")
    channel = Channel()
    launcher = Launcher(settings(srun, spare_check=CHECK), channel)  # type: ignore[arg-type]
    with capture_logs() as logs:
        thread, _ = run_in_thread(launcher)
        wait(lambda: any(e["event"] == "launcher_spare_check_found_fatal" for e in logs))
        n = len(channel.reports)
        wait(lambda: len(channel.reports) > n + 2)
        assert thread.is_alive() and channel.reports[-1].alive
        launcher.stopping.set()
        thread.join(5)
    fatal = next(e for e in logs if e["event"] == "launcher_spare_check_found_fatal")
    assert fatal["exit_code"] == 2 and fatal["spares"] == ["n3"] and fatal["log_level"] == "warning"


def test_a_check_that_cannot_start_is_logged(tmp_path: Path) -> None:
    with capture_logs() as logs:
        check = SpareCheck([str(tmp_path / "no-such-srun"), "check"], ("n3",), 5.0)
        check.start()
        check.join(5)
    failed = next(e for e in logs if e["event"] == "launcher_spare_check_failed")
    assert "no-such-srun" in failed["error"] and failed["log_level"] == "error" and failed["spares"] == ["n3"]


def test_no_check_without_spares_or_without_a_check_command(tmp_path: Path) -> None:
    for kw in ({"allocation": ("n1", "n2"), "spare_check": CHECK}, {}):
        srun, log = fake_srun(tmp_path, "exit 0")
        log.unlink(missing_ok=True)
        thread, result = run_in_thread(Launcher(settings(srun, **kw), None))
        thread.join(5)
        assert result == [0] and len(lines_of(log)) == 1 and SPARE_CHECK_NAME not in log.read_text()


def test_the_default_check_is_this_installations_agent_reporting_to_the_daemon() -> None:
    argv = _spare_check(None, "http://login1:8471", "llm", None)
    assert argv == (sys.executable, "-m", "supervisor", "agent", "--once", "--send", "--daemon-url", "http://login1:8471", "--run", "llm")  # fmt: skip
    assert _spare_check(None, "http://login1:8471", "llm", "/t/tok")[-2:] == ("--token-file", "/t/tok")
    assert _spare_check(None, None, "llm", None) == ()  # no daemon to tell: no check
    assert _spare_check("bash -c 'exec check --x'", None, None, None) == ("bash", "-c", "exec check --x")


def test_a_check_without_a_report_still_reports_why_as_an_agent() -> None:
    hung = CheckResult((), None, 4.0, "NVML check failed (exit 1): Traceback\n  boom\x1b[31m")
    report = as_agent_report(hung, "gpu3")
    assert (report.node, report.source, report.interval_s, report.gpus) == ("gpu3", "agent", 0.0, ())
    assert check_batch(ReportBatch(v=1, node="gpu3", reports=(report,))) is None  # the ingest takes it
    assert "\n" not in report.errors[0] and "\x1b" not in report.errors[0]
