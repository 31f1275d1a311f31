"""Real PyTorch training supervised end to end, timed: a node crash and an unhealed loss spike.

The scenarios are the e2e tests' (``supervisor.testing.torch.torch_scenarios``): examples/torch/train.py
(a tiny GPT, 2 nodes, torchrun + gloo, steps paced at 0.1 s, DCP checkpoints every 20 steps in a
private Ceph RADOS Gateway) under the real daemon (0.5 s polls) on a private Slurm (LocalSlurm,
4 nodes, one named spare).

* crash: the batch host is crashed (``LocalSlurm.crash_node``) 10 steps past a checkpoint;
  ``--corrupt`` runs the tests' variant instead (the newest checkpoint's shard overwritten in
  Ceph, found corrupt, then the crash).
* spike: batches 81-120 of the corpus are poisoned; the spike does not heal and the supervisor
  rolls back to the checkpoint before it, skipping them.

Figures: ``crash_to_first_step_s`` (the crash to the restarted job's first trained step, its trace
line), ``lost_steps_crash`` (the last step attempt 0 trained minus the step resumed from) beside
its bound (steps since the newest checkpoint verified at the crash + the steps in one detection
interval: the checkpoint scan interval, 1 s = 10 steps, within which a new checkpoint may not be
verified yet), ``rollback_to_first_step_s`` (the logbook's rollback decision to the restarted
job's first trained step) and ``poisoned_batches_seen_after_rollback`` (goal 0).

Usage: .venv/bin/python bench/e2e.py [--scenario crash|spike|both] [--corrupt] [--keep]
The last line of stdout is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import fmt_s, quiet_logs, table  # noqa: E402

from supervisor.testing import LocalSlurm  # noqa: E402
from supervisor.testing.servers.s3servers import CephRgw  # noqa: E402
from supervisor.testing.torch import torch_scenarios as scenarios  # noqa: E402


def crash_figures(out: scenarios.Outcome) -> dict[str, Any]:
    crashed = out.marks["crashed"]
    last_before = out.run.trained(0)[-1]["step"]
    resumed = out.events("restarted")[0]["evidence"]["resume_step"]
    attempts = len(out.status["attempts"])
    verified = newest_verified_at(out, crashed)
    detection_steps = math.ceil(scenarios.SCAN_INTERVAL_S / scenarios.STEP_S)
    return {
        "crash_to_first_step_s": round(out.first_trained_after(crashed) - crashed, 2),
        "crash_detected_s": since(out, "fault", crashed),
        "crash_resubmitted_s": since(out, "restarted", crashed),
        "crash_job_running_s": since(out, "started", crashed),
        "lost_steps_crash": last_before - resumed,
        "lost_steps_crash_bound": last_before - verified + detection_steps,
        "crash_last_step": last_before,
        "crash_resume_step": resumed,
        "crash_attempts": attempts,  # 2: the restarted job trained to the end
        "crash_newest_verified_step": verified,
    }


def since(out: scenarios.Outcome, kind: str, when: float) -> float | None:
    """Seconds from ``when`` to the first logbook event of ``kind`` after it."""
    at = next((e["at"] for e in out.book if e["kind"] == kind and e["at"] >= when), None)
    return round(at - when, 2) if at is not None else None


def newest_verified_at(out: scenarios.Outcome, when: float) -> int:
    """The newest checkpoint step verified by ``when`` and not found corrupt since (0: none)."""
    state: dict[str, tuple[int, bool]] = {}
    for e in sorted(out.book, key=lambda e: e["at"]):
        if e["at"] <= when and e["kind"] in ("checkpoint_verified", "checkpoint_corrupt"):
            ev = e["evidence"]
            state[ev["location"]] = (ev["step"] or 0, e["kind"] == "checkpoint_verified")
    return max((step for step, good in state.values() if good), default=0)


def spike_figures(out: scenarios.Outcome) -> dict[str, Any]:
    rollback = out.events("rollback")[0]
    first, last = scenarios.POISON
    seen = [e["batch"] for seq in range(1, len(out.status["attempts"])) for e in out.run.trained(seq)]
    ev = rollback["evidence"]
    return {
        "rollback_to_first_step_s": round(out.first_trained_after(rollback["at"]) - rollback["at"], 2),
        "rollback_job_running_s": since(out, "started", rollback["at"]),
        "poisoned_batches_seen_after_rollback": sum(first <= b <= last for b in seen),
        "rollback_checkpoint_step": ev["checkpoint_step"],
        "rollback_skip": f"{ev['skip_first']}-{ev['skip_last']}",
        "rollback_onset_step": ev["onset_step"],
    }


def run(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    server = CephRgw(base, keep_dir=args.keep)
    cluster = LocalSlurm(base_dir=base, keep_dir=args.keep)
    with cluster, server:
        for name in ("crash", "spike"):
            if args.scenario not in (name, "both"):
                continue
            work = base / name
            work.mkdir()
            began = time.monotonic()
            if name == "crash":
                plan = scenarios.CORRUPT_CRASH if args.corrupt else scenarios.PLAIN_CRASH
                figures |= crash_figures(scenarios.crash(cluster, server, work, plan))
            else:
                figures |= spike_figures(scenarios.spike(cluster, server, work))
            figures[f"{name}_scenario_s"] = round(time.monotonic() - began, 1)
            cluster.reset()
    return figures


def report(figures: dict[str, Any], args: argparse.Namespace) -> None:
    rows = []
    if "lost_steps_crash" in figures:
        crash = "crash (newest checkpoint corrupt)" if args.corrupt else "crash"
        rows.append([crash, "crash to first step", f"{fmt_s(figures['crash_to_first_step_s'])} s", ""])
        for key, what in (("detected", "fault"), ("resubmitted", "restarted"), ("job_running", "started")):
            rows.append(["", f"  of which to `{what}`", f"{fmt_s(figures[f'crash_{key}_s'])} s", ""])
        bound = figures["lost_steps_crash_bound"]
        rows.append(["", "steps lost", figures["lost_steps_crash"], f"<= {bound}"])
        rows.append(
            ["", "last step / resumed from", f"{figures['crash_last_step']} / {figures['crash_resume_step']}", ""]
        )
    if "poisoned_batches_seen_after_rollback" in figures:
        rows.append(["spike", "rollback to first step", f"{fmt_s(figures['rollback_to_first_step_s'])} s", ""])
        rows.append(["", "  of which to `started`", f"{fmt_s(figures['rollback_job_running_s'])} s", ""])
        rows.append(["", "poisoned batches trained after", figures["poisoned_batches_seen_after_rollback"], "0"])
        rows.append(
            ["", "rolled back to / skipped", f"{figures['rollback_checkpoint_step']} / {figures['rollback_skip']}", ""]
        )
    print(table(rows, ["scenario", "figure", "measured", "goal"]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", choices=("crash", "spike", "both"), default="both")
    p.add_argument("--corrupt", action="store_true", help="the crash scenario with the newest checkpoint corrupted")
    p.add_argument("--keep", action="store_true", help="keep the work, Ceph and Slurm directories")
    args = p.parse_args()
    quiet_logs()
    reason = CephRgw.unavailable_reason()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    base.chmod(0o755)  # munged wants its socket's folders open to all
    print(f"work directory: {base}", file=sys.stderr)
    try:
        figures = run(args, base)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    report(figures, args)
    goals = {"lost_steps_within_bound": figures.get("lost_steps_crash", 0) <= figures.get("lost_steps_crash_bound", 0)}
    goals["load_avg_1m"] = round(os.getloadavg()[0], 1)  # the machine is shared: say how busy it was
    goals["no_poisoned_batch_after_rollback"] = figures.get("poisoned_batches_seen_after_rollback", 0) == 0
    print(json.dumps(figures | goals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
