"""The sbatch options the supervisor owns (a run spec may not set them: the supervisor sets them
itself, or they would defeat recovery), checked in ``sbatch_args`` and in the script's
``#SBATCH`` lines."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from supervisor.config.errors import fail


@dataclass(frozen=True)
class OwnedOption:
    longs: tuple[str, ...]
    shorts: str
    why: str
    fix: str


PINNING = OwnedOption(
    ("nodelist", "nodefile"),
    "wF",
    "pins the job to named nodes, so a restart could never move off a failed node (pinning breaks requeue)",
    "remove it; select node types with --constraint, and name stand-in nodes under [spares]",
)
OWNED_OPTIONS = (
    OwnedOption(("nodes",), "N", "sets the node count, which the supervisor owns", "remove it and set run.nodes"),
    OwnedOption(
        ("partition",), "p", "sets the partition, which the supervisor owns", "remove it and set run.partition"
    ),
    OwnedOption(
        ("exclude",),
        "x",
        "the supervisor builds --exclude from the nodes it found faulty and would overwrite yours",
        "remove it; to keep a node out of every job, drain it in Slurm",
    ),
    OwnedOption(
        ("job-name",),
        "J",
        "the supervisor names each job after run.name so it can find its jobs again",
        "remove it and set run.name",
    ),
    OwnedOption(
        ("comment",),
        "",
        "the supervisor tags its jobs with --comment to re-adopt them after a daemon restart",
        "remove it",
    ),
    OwnedOption(
        ("requeue", "no-requeue"),
        "",
        "the supervisor chooses requeue or resubmit from restart.mode",
        'remove it and set restart.mode = "requeue" or "resubmit"',
    ),
    PINNING,
)
# sbatch options sharing a prefix with an owned one: such an abbreviation is ambiguous to sbatch
# itself (it refuses it), so it is not ours to reject.
_NEIGHBOURS = ("exclusive", "no-kill")


def owned_option(arg: str, owned: Sequence[OwnedOption] = OWNED_OPTIONS) -> OwnedOption | None:
    """The owned option that ``arg`` sets, if any. sbatch accepts unique prefixes of long names."""
    if arg.startswith("--"):
        name = arg[2:].split("=", 1)[0]
        return next((o for o in owned if _abbreviates(name, o.longs)), None)
    if len(arg) >= 2 and arg[0] == "-":
        return next((o for o in owned if arg[1] in o.shorts), None)
    return None


def _abbreviates(name: str, longs: tuple[str, ...]) -> bool:
    if name in longs:
        return True
    prefix_of_ours = len(name) >= 3 and any(o.startswith(name) for o in longs)
    return prefix_of_ours and not any(n.startswith(name) for n in _NEIGHBOURS)


def check_sbatch_arg(arg: str) -> str:
    option = owned_option(arg)
    if option is not None:
        raise fail(option.why, option.fix)
    return arg


def sbatch_directives(script: Path) -> list[tuple[int, str]]:
    """The script's ``#SBATCH`` lines and their numbers; sbatch stops at the first command."""
    found: list[tuple[int, str]] = []
    with script.open(encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, start=1):
            text = line.strip()
            if text.startswith("#SBATCH"):
                found.append((number, text))
            elif text and not text.startswith("#"):
                break
    return found


def check_script_pinning(script: Path) -> None:
    """``--exclude`` and friends on the command line beat the script's; pinning does not."""
    for number, line in sbatch_directives(script):
        if any(owned_option(word, (PINNING,)) for word in line.split()[1:]):
            raise fail(
                f'line {number} of the script, "{line}", {PINNING.why}',
                f"delete that line from {script.name}; select node types with --constraint instead",
            )
