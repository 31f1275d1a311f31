"""Evidence before the kill (issue 35) on a real Slurm with the real daemon and examples/torch
(gloo, 2 nodes of 4, one rank each): one run, three hangs in a row, each made by the trainer's
``--stall-file``, each captured with the real py-spy through an overlapping step before the cancel.

1. The rank on the second node stalls in its data loader while rank 0 waits in the all-reduce:
   the hang entry names that rank and node from the stacks, the restart keeps the node out, and the
   capture's time (its figure) is within the 30 s bound.
2. One rank waits in a receive nobody sends while the other waits in the all-reduce: every rank
   is in a collective — "no single rank", nobody blamed, nothing more excluded.
3. ptrace refused (py-spy attaches from a user namespace of its own: the kernel says EPERM): the
   cancel comes on time and the hang entry says why there are no stacks.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from supervisor.testing.slurm.daemon import SupervisorProcess
from supervisor.testing.slurm.localslurm import LocalSlurm
from supervisor.testing.torch.torch_scenarios import last_step, wait_for
from supervisor.testing.torch.torchrun import TorchRun

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

PY_SPY = shutil.which("py-spy", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
HANG = "[hang]\nmultiple = 2.0\nfloor_s = 4.0\ncap_s = 60.0\nstartup_grace_s = 120.0\n"


@dataclass
class Hangs:
    faults: list[dict[str, Any]] = field(default_factory=list)  # the three hang entries, in order
    stalled: list[str] = field(default_factory=list)  # the node told to stall, each time
    cancel_s: list[float] = field(default_factory=list)  # stall written -> the next attempt running
    status: dict[str, Any] = field(default_factory=dict)
    book: str = ""
    files: list[Path] = field(default_factory=list)
    listed: str = ""  # `slurm-supervisor logbook gpt`


def _wrapper(workdir: Path, real: str) -> tuple[Path, Path]:
    """A py-spy that runs the real one, from a user namespace of its own once ``refuse`` exists."""
    refuse = workdir / "refuse"
    path = workdir / "py-spy"
    path.write_text(f'#!/bin/bash\n[[ -e {refuse} ]] && exec unshare --user {real} "$@"\nexec {real} "$@"\n')
    path.chmod(0o755)
    return path, refuse


def _hang(sup: SupervisorProcess, run: TorchRun, attempt: int, node: str, kind: str, out: Hangs) -> None:
    # the hang detector learns the step interval first (else its start-up grace applies)
    wait_for(f"attempt {attempt} trains", lambda: len(run.trained(attempt)) >= 25, 120, sup, 0.2)
    at = last_step(run, attempt) + 3
    stall = run.workdir / "stall"
    stall.with_name("stall.done").unlink(missing_ok=True)
    stall.write_text(f"{node} {at} {kind}")
    began = time.time()
    out.stalled.append(node)
    fault = wait_for(f"hang {len(out.faults) + 1}", lambda: _new_hang(sup, len(out.faults)), 60, sup, 0.5)
    out.faults.append(fault)
    sup.wait_running("gpt", attempt=attempt + 1, timeout=60, interval=0.5)
    out.cancel_s.append(time.time() - began)


def _new_hang(sup: SupervisorProcess, seen: int) -> dict[str, Any] | None:
    hangs = [e for e in sup.logbook("gpt") if e["kind"] == "fault" and "hang" in e["message"]]
    return hangs[seen] if len(hangs) > seen else None


@pytest.fixture(scope="module")
def hangs(_slurm_session: LocalSlurm | str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hangs]:
    if isinstance(_slurm_session, str) or PY_SPY is None or shutil.which("unshare") is None:
        why = _slurm_session if isinstance(_slurm_session, str) else "py-spy or unshare missing"
        if os.environ.get("CI", "").strip().lower() == "true":
            pytest.fail(f"required under CI=true: {why}", pytrace=False)
        pytest.skip(why)
    pytest.importorskip("torch")
    cluster = _slurm_session
    cluster.reset()
    workdir = tmp_path_factory.mktemp("stacks")
    py_spy, refuse = _wrapper(workdir, PY_SPY)
    (workdir / "ckpt").mkdir()
    args = ["--steps", "600", "--ckpt-every", "20", "--min-step-s", "0.2", "--stall-file", str(workdir / "stall")]
    run = TorchRun(workdir, cluster.partition, str(workdir / "ckpt"), train_args=args)
    run.write_corpus()
    spec = run.spec(checkpoints="full_verify = false\n", restart="backoff_base_s = 1.0\n", max_restarts=6)
    stacks = f'[stacks]\ndeadline_s = 25\npy_spy = "{py_spy}"\n'
    sup = SupervisorProcess(cluster, workdir, extra=HANG + stacks)
    sup.start(env={"PYTHONUNBUFFERED": "1"})
    out = Hangs()
    try:
        sup.cli("submit", str(spec))
        first = sup.wait_running("gpt", attempt=0, interval=0.5)
        _hang(sup, run, 0, first["running_on"][1], "loader", out)  # rank 1, not the batch host
        second = sup.status("gpt")
        _hang(sup, run, 1, second["running_on"][1], "recv", out)
        refuse.touch()
        third = sup.status("gpt")
        _hang(sup, run, 2, third["running_on"][1], "loader", out)
        out.status = sup.status("gpt")
        out.listed = sup.cli("logbook", "gpt").stdout
    finally:
        out.book = "\n".join(f"{e['kind']:>24} {e['message'][:400]}" for e in sup.logbook("gpt"))
        out.files = sorted((sup.state_dir / "stacks" / "gpt").glob("*.json"))
        sup.stop()
    yield out


def test_the_rank_stuck_in_its_data_loader_is_named_and_its_node_kept_out(hangs):
    fault = hangs.faults[0]
    node = hangs.stalled[0]
    stacks = fault["evidence"]["stacks"]
    assert f"stacks: suspect {node}: rank 1 ({node}) in data loading (load_batch, " in fault["message"], hangs.book
    assert "while the other rank waits in all_reduce" in fault["message"]
    assert stacks["suspect_nodes"] == [node] and fault["evidence"]["suspect_nodes"] == [node]
    assert stacks["capture_s"] <= 30.0 and stacks["file"]
    assert node in hangs.status["excluded"], hangs.status
    print(f"capture {stacks['capture_s']:.2f} s; stall -> restarted without {node}: {hangs.cancel_s[0]:.1f} s")


def test_every_rank_in_a_collective_blames_nobody(hangs):
    fault = hangs.faults[1]
    stacks = fault["evidence"]["stacks"]
    assert "stacks: no single rank: all 2 ranks wait in collectives (all_reduce ×1, recv ×1)" in fault["message"], (
        hangs.book
    )
    assert stacks["suspect_nodes"] == [] and not fault["evidence"].get("suspect_nodes")
    assert sorted(hangs.status["excluded"]) == [hangs.stalled[0]], hangs.status  # nothing more kept out
    print(f"capture {stacks['capture_s']:.2f} s; stall -> restarted: {hangs.cancel_s[1]:.1f} s")


def test_ptrace_refused_cancels_on_time_and_says_why(hangs):
    fault = hangs.faults[2]
    stacks = fault["evidence"]["stacks"]
    assert "stacks: no stacks: " in fault["message"] and "ptrace refused" in fault["message"], hangs.book
    assert re.search(r"\(after \d+\.\d s; the cancel follows\)", fault["message"]), fault["message"]
    assert not stacks["captured"] and stacks["capture_s"] < 10.0
    assert sorted(hangs.status["excluded"]) == [hangs.stalled[0]]
    assert len(hangs.files) == 3  # every capture kept, the failed one too
    assert "stack captures before a hang's cancel (`slurm-supervisor stacks gpt`):" in hangs.listed
    assert all(f"  {f.stem}  " in hangs.listed for f in hangs.files)
    print(f"capture {stacks['capture_s']:.2f} s; stall -> restarted: {hangs.cancel_s[2]:.1f} s")
