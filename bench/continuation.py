"""Past the time limit (issue 31): a run as a chain of jobs, supervised and hand-made, on a real Slurm
and in the simulator at Llama 3 scale.

**Real Slurm** (``--part slurm``): examples/torch (a tiny GPT, 2 nodes, torchrun + gloo on CPU,
steps paced at 0.2 s, checkpoints on a directory, no periodic save) on a private Slurm
(LocalSlurm, 4 nodes), each job with ``--time=2`` and ``--signal=B:USR1@60``: the trainer ends on
purpose 60 s before the limit — on its own clock (``SSV_DEADLINE``) or on the signal, whichever is
first — saving the step it completed and exiting 75. So each job trains for about a minute.

* supervised: the real daemon (0.5 s polls), ``[continuation] signal = "USR1", lead_s = 60,
  prequeue_s = 100, time_limit_s = 120``: each successor is pre-queued held 20 s after its
  predecessor starts and released once the end is judged. The run is cancelled once ``--jobs``
  continuations are done (the trainer would go on).
* hand-made, the script every team writes first: the same trainer and batch script with
  ``#SBATCH --time=2 --signal=B:USR1@60``; it resumes from the newest committed checkpoint in the
  folder, and when the trainer exits 75 its last line submits the same script again (``sbatch``,
  a new job at the back of the queue). Stopped after as many jobs.

A poller reads ``squeue`` every 0.2 s: a job's end is the first poll that no longer shows it
RUNNING, its start the first that does; **gap** = successor's start − predecessor's end (so both
chains are measured alike, ±0.2 s). **lost steps** per continuation = the last step a job trained −
(the first step its successor trained − 1), from the trainer's trace. ``restarts_spent`` and
``interruptions`` (in ``logbook goodput``, before the cancel) are the supervised run's. On this
idle private cluster nothing else waits in the queue, so the hand-made chain's gap is Slurm's own
start latency; what the queue costs it is the simulator's part.

**Simulator** (``--part sim``): Llama 3 405B (16,384 GPUs, 54 days, Table 5's failures, 64 spares),
the real engine, each seed's draw run: with no limit; with a ``--max-job-hours`` (24) partition
limit; the hand-made chain on that limit (Slurm alone with the same 64 idle nodes: requeue on a
fault, the trainer saves on ``--signal``, the script resubmits itself at the end) — first without a
queue, then with every job entering the queue waiting a log-normal time (``--queue-wait-minutes``
median 10, sigma 1: an assumption, supervisor/sim/training/chain.py) and the supervised chain also without
pre-queueing (``prequeue_s = 0``). Figures: ETTR of each, the planned ends, and the gaps.

    .venv/bin/python bench/continuation.py                  # both parts (~10 min on 2 cores)
    .venv/bin/python bench/continuation.py --part sim --seeds 4
The last line of stdout is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import quiet_logs, table  # noqa: E402

from supervisor.domain.checkpoints.manifest import MANIFEST_NAME  # noqa: E402
from supervisor.sim.plan import make_plan, run_seeds  # noqa: E402
from supervisor.sim.training.chain import ChainSettings  # noqa: E402
from supervisor.sim.training.results import quantile  # noqa: E402
from supervisor.sim.training.settings import Mode, SimSettings  # noqa: E402
from supervisor.sim.training.time_limits import chain_summary  # noqa: E402
from supervisor.testing import LocalSlurm  # noqa: E402
from supervisor.testing.slurm.daemon import SupervisorProcess  # noqa: E402
from supervisor.testing.torch.torch_scenarios import wait_for  # noqa: E402
from supervisor.testing.torch.torchrun import EXAMPLE, TorchRun  # noqa: E402

TRAIN_ARGS = ["--steps", "1000000", "--ckpt-every", "1000000", "--min-step-s", "0.2"]
LIMIT = ["--time=2"]  # minutes: the signal (and the trainer's own clock) 60 s before it
CONTINUATION = '[continuation]\nsignal = "USR1"\nlead_s = 60\nprequeue_s = 100\ntime_limit_s = 120\n'


# -- the real-Slurm part ----------------------------------------------------------------------------


@dataclass
class Poller:
    """Each job's first and last poll RUNNING, from ``squeue`` every ``every_s`` (a thread)."""

    cluster: LocalSlurm
    name: str
    every_s: float = 0.2
    started: dict[str, float] = field(default_factory=dict)
    ended: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Poller:
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.wait(self.every_s):
            out = self.cluster.run(["squeue", "-h", "-n", self.name, "-t", "RUNNING", "-o", "%i"]).stdout
            now, running = time.time(), set(out.split())
            for job in running:
                self.started.setdefault(job, now)
            for job in self.started:
                if job not in running:
                    self.ended.setdefault(job, now)

    def gaps(self) -> list[float]:
        jobs = sorted(self.started, key=int)
        return [self.started[b] - self.ended[a] for a, b in pairwise(jobs) if a in self.ended]


def lost_steps(run: TorchRun) -> list[int]:
    """Per continuation: the last step a job trained minus the step its successor began after."""
    by_job: dict[str, list[int]] = {}
    for e in run.trace():
        if not e.get("skipped"):
            by_job.setdefault(str(e["job"]), []).append(int(e["step"]))
    jobs = sorted(by_job, key=int)
    return [max(by_job[a]) - (min(by_job[b]) - 1) for a, b in pairwise(jobs)]


def supervised_chain(cluster: LocalSlurm, work: Path, continuations: int) -> dict[str, Any]:
    work.mkdir(parents=True)
    run = TorchRun(work, cluster.partition, str(work / "ckpt"), train_args=TRAIN_ARGS)
    run.write_corpus()
    spec = run.spec(checkpoints=f'full_verify = false\nresume_file = "{work / "resume.json"}"\n')
    text = spec.read_text().replace("nodes = 2\n", f"nodes = 2\nsbatch_args = {json.dumps(LIMIT)}\n", 1)
    spec.write_text(text + CONTINUATION)
    sup = SupervisorProcess(cluster, work)
    sup.start()
    try:
        with Poller(cluster, "gpt") as poll:
            sup.cli("submit", str(spec))
            timeout = 150.0 * (continuations + 1)
            wait_for(f"{continuations} continuations", lambda: _continued(sup) >= continuations, timeout, sup, 1.0)
            wait_for("the last job training", lambda: len(lost_steps(run)) >= continuations, 90, sup, 0.5)
            stopped = time.time()
            status = sup.status("gpt")
            goodput = json.loads(sup.cli("logbook", "goodput", "gpt", "--json").stdout)
            sup.cli("cancel", "gpt")
            sup.wait_ended("gpt", timeout=60)
    finally:
        sup.stop()
    return {
        "continuations": _continued(sup),
        "restarts_spent": status["restarts"]["spent"],
        "interruptions": sum(1 for i in goodput["interruption_list"] if i["at"] < stopped),
        "lost_steps": lost_steps(run)[:continuations],
        "gaps_s": poll.gaps()[:continuations],
        "jobs": len(poll.started),
        "faults": sum(1 for e in sup.logbook("gpt") if e["kind"] == "fault"),
    }


def _continued(sup: SupervisorProcess) -> int:
    return sum(1 for e in sup.logbook("gpt") if e["kind"] == "continued")


HANDMADE = """\
#SBATCH --job-name=hand
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=2
#SBATCH --signal=B:USR1@60
#SBATCH --output={work}/hand-%j.out
# The hand-made chain: resume from the newest committed checkpoint, save on the signal (the
# example's batch script below hands it to the trainer), and submit this script again at the end
# when the trainer says it saved to go on (exit 75).
export SSV_CONTINUE_SIGNAL=USR1 SSV_CONTINUE_LEAD_S=60 SSV_CONTINUE_EXIT_CODE=75
for d in $(ls -d "$CKPT"/step_* 2>/dev/null | sort -r); do
    if [ -f "$d/{manifest}" ]; then
        export SSV_RESUME_CHECKPOINT=$d SSV_RESUME_STEP=$((10#${{d##*step_}}))
        break
    fi
done
"""
RESUBMIT = """\
if [ "$rc" = 75 ] && [ ! -e "$STOP" ]; then
    sbatch -p "$SLURM_JOB_PARTITION" -D "$SLURM_SUBMIT_DIR" "$HANDMADE_SCRIPT"
fi
exit "$rc"
"""


def handmade_script(work: Path) -> str:
    """The preamble, then examples/torch/train.sbatch's body with its last line (``exit "$rc"``)
    replaced by the resubmission."""
    body = (EXAMPLE / "train.sbatch").read_text().split("\n", 1)[1].rstrip("\n")
    assert body.endswith('exit "$rc"'), "train.sbatch's last line changed"
    return "#!/bin/bash\n" + HANDMADE.format(work=work, manifest=MANIFEST_NAME) + body[: -len('exit "$rc"')] + RESUBMIT


def handmade_chain(cluster: LocalSlurm, work: Path, continuations: int) -> dict[str, Any]:
    work.mkdir(parents=True)
    run = TorchRun(work, cluster.partition, str(work / "ckpt"), train_args=TRAIN_ARGS)
    run.write_corpus()
    spec = run.spec()  # for its environment only: the trainer's settings, as the supervised run has them
    env = _spec_env(spec)
    script = work / "hand.sbatch"
    script.write_text(handmade_script(work))
    stop = work / "stop"
    env |= {"CKPT": str(work / "ckpt"), "STOP": str(stop), "HANDMADE_SCRIPT": str(script)}
    full = {**os.environ, **cluster.env, **env}
    with Poller(cluster, "hand") as poll:
        subprocess.run(
            ["sbatch", "-p", cluster.partition, "-D", str(work), str(script)], env=full, check=True, capture_output=True
        )
        deadline = time.monotonic() + 150.0 * (continuations + 1)
        while len(lost_steps(run)) < continuations and time.monotonic() < deadline:
            time.sleep(0.5)
        stop.touch()  # the running job is the last: it submits nothing
        cluster.run(["scancel", "-n", "hand"])
        time.sleep(1.0)
    return {
        "continuations": min(len(poll.started) - 1, continuations),
        "lost_steps": lost_steps(run)[:continuations],
        "gaps_s": poll.gaps()[:continuations],
        "jobs": len(poll.started),
    }


def _spec_env(spec: Path) -> dict[str, str]:
    import tomllib

    return dict(tomllib.loads(spec.read_text())["run"]["env"])


def slurm_part(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    cluster = LocalSlurm(base_dir=base, keep_dir=args.keep)
    with cluster:
        began = time.monotonic()
        sup = supervised_chain(cluster, base / "supervised", args.jobs)
        cluster.reset()
        hand = handmade_chain(cluster, base / "handmade", args.jobs)
        elapsed = time.monotonic() - began
    return {"supervised": sup, "handmade": hand, "slurm_part_s": round(elapsed, 1)}


# -- the simulator part -------------------------------------------------------------------------------


def sim_part(args: argparse.Namespace) -> dict[str, Any]:
    seeds = list(range(args.seeds))
    limit = args.max_job_hours * 3600.0
    queue = ChainSettings(queue_wait_median_s=args.queue_wait_minutes * 60.0, queue_wait_sigma=1.0)
    cases = {
        "no_limit": (ChainSettings(), (Mode.SUPERVISOR,)),
        "limit": (ChainSettings(max_job_s=limit), (Mode.SUPERVISOR, Mode.BASELINE)),
        "queue_no_limit": (queue, (Mode.SUPERVISOR,)),
        "queue_limit": (replace(queue, max_job_s=limit), (Mode.SUPERVISOR, Mode.BASELINE)),
        "queue_limit_no_prequeue": (replace(queue, max_job_s=limit, prequeue_s=0), (Mode.SUPERVISOR,)),
    }
    base = SimSettings(spares=64, baseline_spares=64, days=args.days)
    out: dict[str, Any] = {}
    for name, (chain, modes) in cases.items():
        plan = make_plan(replace(base, chain=chain), "auto")
        results = run_seeds(plan, modes, seeds, Path(tempfile.mkdtemp(prefix=f"bench-chain-{name}-")))
        for mode, rs in results.items():
            key = f"{name}_{'handmade' if mode is Mode.BASELINE else 'supervisor'}"
            out[key] = {
                "ettr": sum(r.ettr for r in rs) / len(rs),
                "interruptions": sum(r.interruptions for r in rs) / len(rs),
                **chain_summary([r.extra.get("chain") for r in rs]),
            }
            print(f"  sim {key}: ETTR {out[key]['ettr']:.4%}", file=sys.stderr, flush=True)
    return out


# -- report --------------------------------------------------------------------------------------------


def figures_of(slurm: dict[str, Any] | None, sim: dict[str, Any] | None) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    if slurm is not None:
        s, h = slurm["supervised"], slurm["handmade"]
        gaps, base = sorted(s["gaps_s"]), sorted(h["gaps_s"])
        doc |= {
            "continuations": s["continuations"],
            "restarts_spent": s["restarts_spent"],
            "interruptions": s["interruptions"],
            "lost_steps_per_continuation": max(s["lost_steps"], default=None),
            "gap_s_p50": _r(quantile(gaps, 0.5)),
            "gap_s_max": _r(max(gaps, default=None)),
            "gap_s_p50_baseline": _r(quantile(base, 0.5)),
            "gap_s_max_baseline": _r(max(base, default=None)),
            "continuations_baseline": h["continuations"],
            "lost_steps_per_continuation_baseline": max(h["lost_steps"], default=None),
            "slurm_part_s": slurm["slurm_part_s"],
        }
    if sim is not None:
        for key, f in sim.items():
            doc[f"sim_ettr_{key}"] = round(f["ettr"], 5)
            if f.get("planned_ends") is not None and "limit" in key and "no_limit" not in key:
                doc[f"sim_planned_ends_{key}"] = f["planned_ends"]
                doc[f"sim_gap_s_p50_{key}"] = _r(f["gap_s_p50"])
                doc[f"sim_gap_s_p99_{key}"] = _r(f["gap_s_p99"])
        doc["sim_ettr_diff_pp"] = round(100 * (sim["no_limit_supervisor"]["ettr"] - sim["limit_supervisor"]["ettr"]), 3)
        doc["sim_ettr_diff_pp_queue"] = round(
            100 * (sim["queue_no_limit_supervisor"]["ettr"] - sim["queue_limit_supervisor"]["ettr"]), 3
        )
    return doc


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def report(doc: dict[str, Any]) -> None:
    rows = [[k, v] for k, v in doc.items()]
    print(table(rows, ["figure", "measured"]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("slurm", "sim", "both"), default="both")
    p.add_argument("--jobs", type=int, default=4, help="continuations of the real chain (default 4: 5 jobs)")
    p.add_argument("--seeds", type=int, default=2, help="simulated seeds (default 2)")
    p.add_argument("--days", type=float, default=54.0)
    p.add_argument("--max-job-hours", type=float, default=24.0)
    p.add_argument("--queue-wait-minutes", type=float, default=10.0)
    p.add_argument("--keep", action="store_true", help="keep the work and Slurm directories")
    args = p.parse_args()
    quiet_logs()
    slurm = sim = None
    if args.part in ("sim", "both"):
        sim = sim_part(args)
    if args.part in ("slurm", "both"):
        base = Path(tempfile.mkdtemp(prefix="bench-continuation-"))
        base.chmod(0o755)  # munged wants its socket's folders open to all
        print(f"work directory: {base}", file=sys.stderr)
        try:
            slurm = slurm_part(args, base)
        finally:
            if not args.keep:
                shutil.rmtree(base, ignore_errors=True)
        print(json.dumps(slurm), file=sys.stderr)
    doc = figures_of(slurm, sim)
    report(doc)
    doc["load_avg_1m"] = round(os.getloadavg()[0], 1)  # the machine is shared: say how busy it was
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
