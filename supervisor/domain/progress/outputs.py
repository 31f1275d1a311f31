"""Where a run's job writes its output: what Slurm reports for the job (squeue's
``standard_output``: in 22.05 the pattern made absolute, ``%j`` and friends not yet expanded),
else the run's ``output`` pattern (or Slurm's default ``slurm-%j.out`` in its workdir), with the
filename patterns sbatch expands for a batch job's single file."""

from __future__ import annotations

from supervisor.domain.run import RunSpec

DEFAULT_PATTERN = "slurm-%j.out"
# Patterns that name one file per node, task or step: no single file to follow.
_PER_PROCESS = frozenset("NnstT")


def output_path(spec: RunSpec, job_id: int, user: str = "", reported: str = "") -> str | None:
    """The absolute path of the job's output file, or None when the pattern makes it per-process.
    ``reported``: the path Slurm reports for the job, which wins over the spec when it is given."""
    pattern = reported or spec.output or DEFAULT_PATTERN
    out: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch != "%" or i + 1 >= len(pattern):
            out.append(ch)
            i += 1
            continue
        j = i + 1
        while j < len(pattern) and pattern[j].isdigit():  # %5j: zero-padded to 5 digits
            j += 1
        width = int(pattern[i + 1 : j] or 0)
        if j >= len(pattern):
            out.append(pattern[i:])
            break
        code = pattern[j]
        if code in _PER_PROCESS:
            return None
        value = {"%": "%", "j": str(job_id), "A": str(job_id), "x": spec.name, "u": user}.get(code)
        out.append(pattern[i : j + 1] if value is None else (value.zfill(width) if code in "jA" else value))
        i = j + 1
    path = "".join(out)
    if not path.startswith("/"):
        path = f"{(spec.workdir or '').rstrip('/')}/{path}"
    return path
