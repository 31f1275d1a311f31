"""sbatch's option grammar (Slurm 22.05) and the options the supervisor owns.

A run spec's ``sbatch_args`` are read the way sbatch's getopt_long reads them: bundled short
options (``-vxgpu-[1-2]`` is ``-v -x gpu-[1-2]``), a short option's value attached or in the next
element, ``--opt=value`` and ``--opt value``, and unique prefixes of long names (``--exc`` is
ambiguous to sbatch; ``--exclu`` is ``--exclude``). The table below was read from sbatch 22.05.8
itself (every option's argument probed with getopt's own errors, hidden aliases included) and
its man page. An owned option is refused however it is spelt; so is a word that is no option
(sbatch would take it for the script). Long names this table lacks (a newer sbatch's) pass: the
element after one is still read as an option, so it cannot smuggle an owned option in.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from supervisor.config.errors import fail
from supervisor.config.script_directives import Directive, UnreadableScript, directives, script_head
from supervisor.domain.text_safety import printable


class Arg(Enum):
    NONE = "none"
    REQUIRED = "required"
    OPTIONAL = "optional"  # only as --opt=value, or attached to the short letter


_REQUIRED = """
account acctg-freq array batch bb bbf begin chdir cluster cluster-constraint clusters comment
constraint container context core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task
deadline delay-boot dependency distribution error exclude export export-file extra-node-info gid
gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres gres-flags hint input
job-name kill-on-invalid-dep licenses mail-type mail-user mcs-label mem mem-bind mem-per-cpu
mem-per-gpu mincpus network nodefile nodelist nodes ntasks ntasks-per-core ntasks-per-gpu
ntasks-per-node ntasks-per-socket ntasks-per-tres open-mode output partition power prefer priority
profile qos reservation signal sockets-per-node switches tasks-per-node thread-spec
threads-per-core time time-min tmp uid wait-all-nodes wckey wrap
"""
_NONE = """
contiguous help hold ignore-pbs no-requeue overcommit oversubscribe parsable quiet reboot requeue
spread-job test-only usage use-min-nodes verbose version wait
"""
_OPTIONAL = "exclusive get-user-env nice no-kill propagate"
LONG: dict[str, Arg] = {
    **dict.fromkeys(_REQUIRED.split(), Arg.REQUIRED),
    **dict.fromkeys(_NONE.split(), Arg.NONE),
    **dict.fromkeys(_OPTIONAL.split(), Arg.OPTIONAL),
}
_ALIASES = {"cluster": "clusters", "tasks-per-node": "ntasks-per-node"}
SHORT = {  # letter -> long name (its argument as LONG says)
    "a": "array", "A": "account", "b": "begin", "B": "extra-node-info", "c": "cpus-per-task",
    "C": "constraint", "d": "dependency", "D": "chdir", "e": "error", "F": "nodefile", "G": "gpus",
    "h": "help", "H": "hold", "i": "input", "J": "job-name", "k": "no-kill", "L": "licenses",
    "m": "distribution", "M": "clusters", "n": "ntasks", "N": "nodes", "o": "output", "O": "overcommit",
    "p": "partition", "q": "qos", "Q": "quiet", "s": "oversubscribe", "S": "core-spec", "t": "time",
    "v": "verbose", "V": "version", "w": "nodelist", "W": "wait", "x": "exclude",
}  # fmt: skip


@dataclass(frozen=True)
class OwnedOption:
    longs: tuple[str, ...]
    why: str
    fix: str


PINNING = OwnedOption(
    ("nodelist", "nodefile"),
    "pins the job to named nodes, so a restart could never move off a failed node (pinning breaks requeue)",
    "remove it; select node types with --constraint, and name stand-in nodes under [spares]",
)
_WAIT = OwnedOption(
    ("wait",),
    "makes sbatch wait for the job to end, holding the supervisor's loop (and every other run) that long",
    "remove it; the supervisor follows the job itself",
)
_ARRAY = OwnedOption(
    ("array",),
    "turns the job into a job array, and the supervisor follows exactly one job per attempt",
    "remove it; register each array task as a run of its own",
)
_CLUSTERS = OwnedOption(
    ("clusters",),
    "sends the job to another cluster, where this supervisor cannot see it",
    "remove it; run a supervisor on that cluster",
)
_DEPENDENCY = OwnedOption(
    ("dependency",),
    "the supervisor decides when each attempt starts; a dependency could hold every restart forever",
    "remove it; register the run once what it depends on is done",
)
OWNED_OPTIONS = (
    OwnedOption(("nodes",), "sets the node count, which the supervisor owns", "remove it and set run.nodes"),
    OwnedOption(("partition",), "sets the partition, which the supervisor owns", "remove it and set run.partition"),
    OwnedOption(
        ("exclude",),
        "the supervisor builds --exclude from the nodes it found faulty and would overwrite yours",
        "remove it; to keep a node out of every job, drain it in Slurm",
    ),
    OwnedOption(
        ("job-name",),
        "the supervisor names each job after run.name so it can find its jobs again",
        "remove it and set run.name",
    ),
    OwnedOption(
        ("comment",),
        "the supervisor tags its jobs with --comment to re-adopt them after a daemon restart",
        "remove it",
    ),
    OwnedOption(
        ("requeue", "no-requeue"),
        "--requeue or --no-requeue is chosen by the supervisor from restart.mode",
        'remove it and set restart.mode = "requeue" or "resubmit"',
    ),
    OwnedOption(
        ("export", "export-file"),
        "the supervisor hands the job its environment (run.env and its own variables) through --export and"
        " --export-file; yours would drop them",
        "remove it; set the job's variables under run.env",
    ),
    OwnedOption(
        ("output", "error"),
        "the supervisor reads the job's output for progress and hangs, and sets where it goes from run.output",
        "remove it and set run.output (the job's stderr goes there with its stdout)",
    ),
    OwnedOption(("chdir",), "the job's folder comes from run.workdir", "remove it and set run.workdir"),
    PINNING,
    _WAIT,
    _ARRAY,
    _CLUSTERS,
    _DEPENDENCY,
)
# What a script's #SBATCH line may not set: the owned options the supervisor's command line does
# not override (command-line options beat the script's).
SCRIPT_OWNED = (PINNING, _WAIT, _ARRAY, _CLUSTERS, _DEPENDENCY)


@dataclass(frozen=True)
class Option:
    """One option as sbatch reads it: its long name (``None`` for a name this table lacks)."""

    name: str | None
    written: str
    value: str | None
    index: int  # the element of the arguments it starts in


class SbatchArgError(ValueError):
    """What sbatch could not read at element ``index``; ``option``: the option short of its value."""

    def __init__(self, index: int, problem: str, fix: str, option: Option | None = None) -> None:
        super().__init__(problem)
        self.index, self.problem, self.fix, self.option = index, problem, fix, option


def read_options(args: Sequence[str]) -> list[Option]:
    """``args`` as sbatch's getopt_long would read them; :class:`SbatchArgError` where it cannot
    (a word that is no option, a missing value, an unknown letter, an ambiguous prefix)."""
    out: list[Option] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or arg == "-" or not arg.startswith("-"):
            raise SbatchArgError(
                i,
                "is not an option: sbatch would take it (and all after it) for the batch script and its arguments",
                "keep only options in sbatch_args; name the script in run.script",
            )
        found, i = _long(args, i) if arg.startswith("--") else _short(args, i)
        out += found
    return out


def _long(args: Sequence[str], i: int) -> tuple[list[Option], int]:
    text, has_value, value = args[i][2:].partition("=")
    name = _resolve(text, i)
    kind = LONG.get(name, Arg.OPTIONAL) if name else Arg.OPTIONAL
    if kind is Arg.NONE and has_value:
        raise SbatchArgError(i, f"sbatch's --{name} takes no value", f"write --{name} alone")
    if kind is Arg.REQUIRED and not has_value:
        if i + 1 >= len(args):
            short = Option(_canonical(name), args[i], None, i)
            raise SbatchArgError(i, f"sbatch's --{name} needs a value", f'write "--{name}=VALUE"', short)
        return [Option(_canonical(name), args[i], args[i + 1], i)], i + 2
    return [Option(_canonical(name), args[i], value if has_value else None, i)], i + 1


def _resolve(text: str, i: int) -> str | None:
    """The long option ``text`` names: itself, or the one option it is a unique prefix of."""
    if text in LONG:
        return text
    matches = [name for name in LONG if name.startswith(text)]
    if len(matches) > 1:
        raise SbatchArgError(
            i, f"--{text} is ambiguous to sbatch ({', '.join('--' + m for m in matches)})", "write the option in full"
        )
    return matches[0] if matches else None


def _canonical(name: str | None) -> str | None:
    return _ALIASES.get(name, name) if name else None


def _short(args: Sequence[str], i: int) -> tuple[list[Option], int]:
    arg, out = args[i], []
    for j, letter in enumerate(arg[1:], start=1):
        name = SHORT.get(letter)
        if name is None:
            raise SbatchArgError(i, f"sbatch has no option -{letter}", "check the option in man sbatch")
        rest = arg[j + 1 :]
        kind = LONG[name]
        if kind is Arg.NONE:
            out.append(Option(name, f"-{letter}", None, i))
            continue
        if kind is Arg.OPTIONAL or rest:
            return [*out, Option(name, f"-{letter}", rest or None, i)], i + 1
        if i + 1 >= len(args):
            short = Option(name, f"-{letter}", None, i)
            raise SbatchArgError(i, f"sbatch's -{letter} (--{name}) needs a value", f'write "-{letter}VALUE"', short)
        return [*out, Option(name, f"-{letter}", args[i + 1], i)], i + 2
    return out, i + 1


def owned(
    options: Sequence[Option], table: Sequence[OwnedOption] = OWNED_OPTIONS
) -> Iterator[tuple[Option, OwnedOption]]:
    """The options that set one the supervisor owns, with what it owns."""
    for option in options:
        hit = next((o for o in table if option.name in o.longs), None)
        if hit is not None:
            yield option, hit


def _described(option: Option) -> str:
    long = f"--{option.name}"
    return f"sets {long}" + (f" (written {option.written})" if option.written.split("=", 1)[0] != long else "")


def check_sbatch_args(args: tuple[str, ...]) -> tuple[str, ...]:
    """A pydantic validator for ``run.sbatch_args``: refuses what sbatch could not read and what
    the supervisor owns, naming the element."""
    try:
        options = read_options(args)
    except SbatchArgError as error:
        options = [error.option] if error.option is not None else []
        if not any(owned(options)):  # an owned option short of its value is refused as owned
            raise fail(error.problem, error.fix, at=error.index, value=args[error.index]) from None
    for option, hit in owned(options):
        raise fail(f"{_described(option)}: {hit.why}", hit.fix, at=option.index, value=args[option.index])
    return args


def check_script_directives(script: Path) -> None:
    """The script's own ``#SBATCH`` lines (read as sbatch reads them: ``script_directives``) may
    not set what the command line cannot override, nor be lines sbatch cannot read."""
    try:
        found = directives(script_head(script))
    except UnreadableScript as error:
        raise fail(f"the batch script: {error}", f"fix {script.name}'s #SBATCH lines") from None
    words = [w for d in found for w in d.words]
    line_of = [d for d in found for _ in d.words]
    try:
        options = read_options(words)
    except SbatchArgError as error:
        options = [error.option] if error.option is not None else []
        if not any(owned(options, SCRIPT_OWNED)):
            raise fail(f"{_where(line_of[error.index])}: {error.problem}", f"fix that line of {script.name}") from None
    for option, hit in owned(options, SCRIPT_OWNED):
        raise fail(
            f"{_where(line_of[option.index])}, {_described(option)}: {hit.why}",
            f"delete that line from {script.name}; {hit.fix}",
        )


def _where(directive: Directive) -> str:
    return f'line {directive.number} of the script, "{printable(directive.line, 200)}"'
