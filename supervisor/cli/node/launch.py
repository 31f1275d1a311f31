"""`slurm-supervisor launch -- CMD...`: the in-allocation launcher, run by the batch script (on the
batch host) of a run with ``[restart] mode = "in-allocation"``. Wiring only (supervisor.agent.launcher)."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import sys
from types import FrameType

import click
import hostlist

from supervisor.adapters.slurm.cli import SlurmCli
from supervisor.agent.launcher import Launcher, LaunchSettings
from supervisor.agent.launcher_client import ChannelClient
from supervisor.agent.step_reach import SlurmdReach
from supervisor.cli.node.agent import _token


def _env_int(name: str, low: int = 1) -> int:
    text = os.environ.get(name, "")
    if not text.isdigit() or int(text) < low:
        raise click.ClickException(f"${name} is {text!r}: run `launch` inside the run's Slurm job (sbatch sets it)")
    return int(text)


def _allocation() -> tuple[str, ...]:
    text = os.environ.get("SLURM_JOB_NODELIST", "")
    try:
        nodes = tuple(hostlist.expand_hostlist(text)) if text else ()
    except hostlist.BadHostlist:
        nodes = ()
    if not nodes or len(nodes) > 65_536:
        raise click.ClickException(f"$SLURM_JOB_NODELIST is {text[:80]!r}: run `launch` inside the run's Slurm job")
    return nodes


def _spare_check(text: str | None, url: str | None, run: str | None, token_file: str | None) -> tuple[str, ...]:
    """The pre-flight check's argv: as given, else this installation's one-shot agent check that
    reports to the daemon (none without a daemon to report to). The token travels in the
    environment (SLURM_SUPERVISOR_TOKEN, set by the supervisor) or as its file, never in argv."""
    if text is not None:
        try:
            argv = tuple(shlex.split(text))
        except ValueError as exc:
            raise click.ClickException(f"--spare-check {text[:80]!r}: {exc}") from None
        if not argv:
            raise click.ClickException("--spare-check is empty: give a command, or --no-spare-check")
        return argv
    if not url or not run:
        return ()
    check = (sys.executable, "-m", "supervisor", "agent", "--once", "--send", "--daemon-url", url, "--run", run)
    return check + (("--token-file", token_file) if token_file else ())


@click.command(context_settings={"ignore_unknown_options": False})
@click.option("--nodes", "run_nodes", type=click.IntRange(1, 65_536), envvar="SSV_RUN_NODES", help="Nodes of the step (env SSV_RUN_NODES, set by the supervisor).")  # fmt: skip
@click.option("--ntasks-per-node", type=click.IntRange(1, 1024), default=1, show_default=True, help="Tasks per node of the step.")  # fmt: skip
@click.option("--poll", "poll_s", type=click.FloatRange(0.1, 60), default=1.0, show_default=True, help="Seconds between polls of the daemon.")  # fmt: skip
@click.option("--decision-wait", "decision_wait_s", type=click.FloatRange(0, 3600), default=30.0, show_default=True, help="After the step fails: seconds to wait for the daemon to relaunch it before exiting with its code.")  # fmt: skip
@click.option("--daemon-url", envvar="SLURM_SUPERVISOR_URL", metavar="URL", help="The daemon's ingest (env SLURM_SUPERVISOR_URL).")  # fmt: skip
@click.option("--run", "run_name", envvar="SLURM_SUPERVISOR_RUN", metavar="RUN", help="The supervised run (env SLURM_SUPERVISOR_RUN).")  # fmt: skip
@click.option("--token-file", envvar="SLURM_SUPERVISOR_TOKEN_FILE", type=click.Path(dir_okay=False), help="File holding the run's token (else env SLURM_SUPERVISOR_TOKEN).")  # fmt: skip
@click.option("--spare-check", "spare_check", metavar="ARGV", envvar="SSV_SPARE_CHECK", help="The pre-flight check run on every hot spare at start, one overlapping step (split like a shell's words, never run by a shell; default: this installation's `agent --once --send`).")  # fmt: skip
@click.option("--no-spare-check", is_flag=True, help="No pre-flight check of the hot spares.")  # fmt: skip
@click.option("--spare-check-timeout", "spare_check_timeout_s", type=click.FloatRange(1, 3600), default=60.0, show_default=True, help="Seconds the pre-flight check may take; then it is stopped (the training step never waits for it).")  # fmt: skip
@click.option("--save-on-failure", "save_on_failure_s", type=click.FloatRange(0, 3600), envvar="SSV_SAVE_ON_FAILURE_S", default=0.0, help="Seconds srun leaves the other tasks after one fails, for the trainer's survivors to save (env SSV_SAVE_ON_FAILURE_S, set by the supervisor from [checkpoints] save_on_failure_s; 0: they are ended at once).")  # fmt: skip
@click.option("--exit-file", type=click.Path(dir_okay=False), help="File the trainer's rank 0 writes its exit code to (named to the step as SSV_STEP_EXIT_FILE); when the step's srun fails, a code there is the step's: torchrun exits only 0 or 1.")  # fmt: skip
@click.argument("command", nargs=-1, required=True)
def launch(
    run_nodes: int | None,
    ntasks_per_node: int,
    poll_s: float,
    decision_wait_s: float,
    daemon_url: str | None,
    run_name: str | None,
    token_file: str | None,
    spare_check: str | None,
    no_spare_check: bool,
    spare_check_timeout_s: float,
    save_on_failure_s: float,
    exit_file: str | None,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND as the job's training step on the run's nodes; swap in hot spares when the
    supervisor says so (docs/in-allocation.md)."""
    allocation = _allocation()
    nodes = run_nodes or len(allocation)
    if nodes > len(allocation):
        raise click.ClickException(f"the step needs {nodes} nodes; the job holds {len(allocation)}")
    client = None
    if daemon_url and run_name:
        try:
            client = ChannelClient(daemon_url, run_name, _token(token_file))
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    settings = LaunchSettings(
        command,
        nodes,
        allocation,
        _env_int("SLURM_JOB_ID"),
        host,
        ntasks_per_node,
        poll_s,
        decision_wait_s,
        spare_check=() if no_spare_check else _spare_check(spare_check, daemon_url, run_name, token_file),
        spare_check_timeout_s=spare_check_timeout_s,
        save_on_failure_s=save_on_failure_s,
        continue_code=_continue_code(),
        exit_file=exit_file,
    )
    # the step's nodes' slurmd, looked at each poll: the daemon hears of a dead node at once (a hint)
    reach = SlurmdReach(SlurmCli(), settings.job_id) if client is not None else None
    launcher = Launcher(settings, client, reach)

    def stop(signum: int, frame: FrameType | None) -> None:
        launcher.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    passed_on = _continue_signal()
    if passed_on is not None:  # [continuation] --signal=B:SIG: the trainer in the step saves on it
        signal.signal(passed_on, lambda signum, frame: launcher.pass_on(signum))
    sys.exit(launcher.run())


def _continue_signal() -> signal.Signals | None:
    """The continuation signal (SSV_CONTINUE_SIGNAL: a name without SIG, or a number), passed on to
    the step; not SIGTERM, which stays the job's cancel. None: none asked, or not a signal."""
    name = os.environ.get("SSV_CONTINUE_SIGNAL", "").strip().upper().removeprefix("SIG")
    if not name:
        return None
    try:
        sig = signal.Signals(int(name)) if name.isdigit() else signal.Signals[f"SIG{name}"]
    except (KeyError, ValueError):
        return None
    return None if sig in (signal.SIGTERM, signal.SIGKILL, signal.SIGSTOP) else sig


def _continue_code() -> int | None:
    text = os.environ.get("SSV_CONTINUE_EXIT_CODE", "")
    return int(text) if text.isdigit() and 1 <= int(text) <= 255 else None
