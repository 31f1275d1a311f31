"""slurm-supervisor's orders as Megatron-LM arguments: which checkpoint to load, which iterations
to skip, the learning-rate scale.

    srun python -m supervisor.telemetry.megatron -- torchrun ... pretrain_gpt.py --load /ckpt --lr 3e-4 ...

rewrites the command's Megatron arguments from ``SSV_RESUME_CHECKPOINT``, ``SSV_SKIP_ITERATIONS``
and ``SSV_LR_SCALE`` and executes it (``--dry-run`` prints it instead). The rewriting is the pure
``megatron_argv``; the orders are read by ``supervisor.telemetry.orders.ResumeOrders`` (for a
pre-queued job, ``SSV_RESUME_FROM_FILE=1``, from the resume file), after the bounds below. docs/recipes.md has the recipe, and what of Megatron's output the supervisor reads.

* **Resume.** The chosen ``.../iter_NNNNNNN`` becomes ``--load PARENT --ckpt-step N`` (Megatron-LM
  loads that iteration, whatever ``latest_checkpointed_iteration.txt`` says). Megatron-DeepSpeed
  has no ``--ckpt-step``: it gets ``--load PARENT`` only when the tracker names that iteration,
  else the command is refused. When the supervisor says there is no verified checkpoint
  (``SSV_RESUME_CHECKPOINT`` set and empty) ``--load`` is removed: training starts from scratch
  rather than from a torn newest iteration. Without the variable the command's own ``--load`` stays.
* **Skip.** Megatron-LM: ``--iterations-to-skip`` with every iteration of the ranges; Megatron-DeepSpeed:
  ``--skip-train-iteration-range 61-131 ...``. Iterations the command already skips are kept.
* **LR.** ``--lr``, ``--min-lr`` and ``--lr-warmup-init`` times the scale, with
  ``--override-opt_param-scheduler`` (else Megatron refuses an LR that differs from the checkpoint's).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from supervisor.telemetry.orders import ResumeOrders

FLAVORS = ("megatron-lm", "megatron-deepspeed")
EXIT_BAD_INPUT = 93  # the orders or the command are wrong: a restart would not help
MAX_ENV_CHARS = 65_536  # any SSV_* value longer than this is refused
MAX_RANGES = 1_024
MAX_ITERATION = 10**12
MAX_EXPANDED = 100_000  # iterations listed one by one in --iterations-to-skip
SCALED_LR_FLAGS = ("--lr", "--min-lr", "--lr-warmup-init")
OVERRIDE, USE_CHECKPOINT = "--override-opt_param-scheduler", "--use-checkpoint-opt_param-scheduler"
SKIP_FLAG = {"megatron-lm": "--iterations-to-skip", "megatron-deepspeed": "--skip-train-iteration-range"}
_ITER_DIR = re.compile(r"iter_([0-9]{7,13})")  # ASCII digits: \d would take any script's digits


class MegatronArgsError(ValueError):
    """The orders or the command cannot be turned into a correct Megatron command."""


def read_orders(env: Mapping[str, str]) -> ResumeOrders:
    """``ResumeOrders.from_env`` after bounding what the environment may hold."""
    for name, value in env.items():
        if name.startswith("SSV_") and (len(value) > MAX_ENV_CHARS or any(ord(c) < 32 for c in value)):
            raise MegatronArgsError(f"{name}: longer than {MAX_ENV_CHARS} characters or holds control characters")
    orders = ResumeOrders.from_env(env)
    if len(orders.skip.ranges) > MAX_RANGES or any(hi > MAX_ITERATION for _, hi in orders.skip.ranges):
        raise MegatronArgsError(f"SSV_SKIP_ITERATIONS: more than {MAX_RANGES} ranges or past {MAX_ITERATION}")
    return orders


def megatron_argv(
    argv: Sequence[str],
    orders: ResumeOrders,
    *,
    resume_managed: bool,
    flavor: str = "megatron-lm",
    tracker: str | None = None,
) -> list[str]:
    """``argv`` (the whole launch command) with the orders applied. ``resume_managed``: the
    supervisor chooses the checkpoint (``SSV_RESUME_CHECKPOINT`` is set, even empty);
    ``tracker``: the text of ``latest_checkpointed_iteration.txt`` next to the chosen iteration
    (Megatron-DeepSpeed only). ``MegatronArgsError`` when the result would not do what it says."""
    if flavor not in FLAVORS:
        raise MegatronArgsError(f"flavor {flavor!r}: one of {', '.join(FLAVORS)}")
    args = _split_equals(argv)
    if resume_managed:
        args = _resume(args, orders, flavor, tracker)
    if orders.skip.ranges:
        args = _skip(args, orders, flavor)
    if orders.lr_scale != 1.0:
        args = _scale_lr(args, orders.lr_scale)
    return args


def _resume(args: list[str], orders: ResumeOrders, flavor: str, tracker: str | None) -> list[str]:
    args, _ = _take(_take(args, "--load", nargs=1)[0], "--ckpt-step", nargs=1)
    if not orders.candidates:
        return args  # no verified checkpoint: from scratch, not from the tracker's newest
    root, iteration = iteration_dir(orders.candidates[0])
    if flavor == "megatron-lm":
        return [*args, "--load", root, "--ckpt-step", str(iteration)]
    if (tracker or "").strip() != str(iteration):
        raise MegatronArgsError(
            f"Megatron-DeepSpeed loads the iteration latest_checkpointed_iteration.txt names "
            f"({(tracker or '').strip()[:20] or 'none'}), not the supervisor's {iteration}: it has no --ckpt-step"
        )
    return [*args, "--load", root]


def iteration_dir(location: str) -> tuple[str, int]:
    """(the checkpoint root, the iteration) of a Megatron ``ROOT/iter_NNNNNNN`` location."""
    path = location.rstrip("/")
    root, _, name = path.rpartition("/")
    match = _ITER_DIR.fullmatch(name)
    if not match or not root or root.startswith("-"):
        raise MegatronArgsError(f"{location[:200]!r} is not a Megatron iteration folder (ROOT/iter_NNNNNNN)")
    return root, int(match.group(1))


def _skip(args: list[str], orders: ResumeOrders, flavor: str) -> list[str]:
    flag = SKIP_FLAG[flavor]
    args, theirs = _take(args, flag, nargs=None)
    if flavor == "megatron-deepspeed":
        ours = [f"{lo}-{hi}" for lo, hi in sorted(set(orders.skip.ranges))]
        return [*args, flag, *dict.fromkeys([*theirs, *ours])]
    iterations = set(skip_iterations(orders)) | {_int(flag, v) for v in theirs}
    return [*args, flag, *map(str, sorted(iterations))]


def skip_iterations(orders: ResumeOrders) -> list[int]:
    """Every iteration of the skip ranges, in order: Megatron-LM's ``--iterations-to-skip``, or
    Megatron-Bridge's ``train.iterations_to_skip``. At most ``MAX_EXPANDED`` of them."""
    ranges = sorted(set(orders.skip.ranges))
    if sum(hi - lo + 1 for lo, hi in ranges) > MAX_EXPANDED:
        raise MegatronArgsError(f"SSV_SKIP_ITERATIONS: more than {MAX_EXPANDED} iterations to list one by one")
    return sorted({i for lo, hi in ranges for i in range(lo, hi + 1)})


def _scale_lr(args: list[str], scale: float) -> list[str]:
    if USE_CHECKPOINT in args:
        raise MegatronArgsError(f"SSV_LR_SCALE cannot apply with {USE_CHECKPOINT}: the checkpoint's LR wins")
    scaled: list[str] = []
    for flag in SCALED_LR_FLAGS:
        args, values = _take(args, flag, nargs=1)
        if values:
            scaled += [flag, repr(_float(flag, values[-1]) * scale)]
        elif flag == "--lr":
            raise MegatronArgsError("SSV_LR_SCALE is set but the command has no --lr to scale")
    return [*(a for a in args if a != OVERRIDE), *scaled, OVERRIDE]


def _take(args: list[str], flag: str, *, nargs: int | None) -> tuple[list[str], list[str]]:
    """``args`` without every occurrence of ``flag`` and its values (``nargs`` values, or all up to
    the next option when None), and those values in order."""
    kept: list[str] = []
    values: list[str] = []
    i = 0
    while i < len(args):
        if args[i] != flag:
            kept.append(args[i])
            i += 1
            continue
        i, taken = i + 1, 0
        while i < len(args) and (nargs is None or taken < nargs) and not _is_option(args[i]):
            values.append(args[i])
            i, taken = i + 1, taken + 1
    return kept, values


def _is_option(token: str) -> bool:
    return token.startswith("--") or (token.startswith("-") and not _is_number(token))


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _split_equals(argv: Sequence[str]) -> list[str]:
    """``--lr=3e-4`` as ``--lr 3e-4`` for the flags rewritten here (argparse reads both)."""
    managed = {"--load", "--ckpt-step", *SCALED_LR_FLAGS, *SKIP_FLAG.values()}
    out: list[str] = []
    for token in argv:
        flag, eq, value = token.partition("=")
        out += [flag, value] if eq and flag in managed else [token]
    return out


def _float(flag: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise MegatronArgsError(f"{flag} {text[:40]!r} is not a number") from None


def _int(flag: str, text: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise MegatronArgsError(f"{flag} {text[:40]!r} is not an iteration number")
    return int(text)


def _tracker(location: str) -> str | None:
    """The tracker file's text next to the chosen iteration (64 bytes at most), None if unreadable."""
    try:
        root, _ = iteration_dir(location)
        with (Path(root) / "latest_checkpointed_iteration.txt").open("rb") as f:
            return f.read(64).decode("ascii", "replace")
    except (OSError, MegatronArgsError):
        return None


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run the command with the orders applied (``--dry-run``: print it). 93 when it cannot be."""
    parser = argparse.ArgumentParser(
        prog="python -m supervisor.telemetry.megatron", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--flavor", choices=FLAVORS, default="megatron-lm")
    parser.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND...: the launch command")
    try:
        ns = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # a wrong launcher line will not get better by restarting
        return EXIT_BAD_INPUT if exc.code else 0
    env = os.environ if env is None else env
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    try:
        if not command:
            raise MegatronArgsError("no command after --")
        orders = read_orders(env)
        tracker = _tracker(orders.candidates[0]) if orders.candidates and ns.flavor != "megatron-lm" else None
        managed = "SSV_RESUME_CHECKPOINT" in env or env.get("SSV_RESUME_FROM_FILE") == "1"
        final = megatron_argv(command, orders, resume_managed=managed, flavor=ns.flavor, tracker=tracker)
    except ValueError as exc:  # MegatronArgsError, or ResumeOrders' own (a bad SSV_LR_SCALE)
        print(f"supervisor.telemetry.megatron: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if ns.dry_run:
        print(shlex.join(final))
        return 0
    os.execvp(final[0], final)  # noqa: S606 - an argv list: the command runs as given, no shell
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
