"""What a Slurm release can do for the adapter, from its version alone: the one place that knows
which release brought what (docs/slurm-releases.md has the measurements behind each line).

The policy never sees a release: the reads (``reads.py``) and writes (``cli.py``) ask this value
which form to use, and the daemon logs once, at its first read, what the running Slurm lacks.
"""

from __future__ import annotations

from dataclasses import dataclass

# --json honours squeue's and sinfo's filters (the man pages: "most filtering arguments are still
# used"); 22.05 ignores them all (measured).
JSON_FILTERS_FROM = (24, 5)
# The data_parser the JSON reads ask for: v0.0.42 is in 24.11 (its default), 25.05, 25.11 and
# 26.05 (default v0.0.45; v0.0.40 and .41 are gone there), so one layout from 24.11 on. Before
# 24.11 the default is asked for (22.05's --json takes no version; 24.05's default is v0.0.41).
PINNED_DATA_PARSER = "v0.0.42"
PINNED_DATA_PARSER_FROM = (24, 11)
# sbatch --requeue=expedite (25.11+): a batch job requeued on a node failure is eligible to start at
# once, as the highest-priority job, and its other nodes are kept from other work meanwhile.
EXPEDITED_REQUEUE_FROM = (25, 11)
# slurmctld serves OpenMetrics itself (MetricsType=metrics/openmetrics, 25.11+).
OPENMETRICS_FROM = (25, 11)


@dataclass(frozen=True)
class SlurmRelease:
    """A running Slurm's (major, minor); None when ``squeue --version`` could not be read (then the
    oldest forms, which every release understands, are used)."""

    version: tuple[int, int] | None

    def _since(self, first: tuple[int, int]) -> bool:
        return self.version is not None and self.version >= first

    @property
    def json_filters(self) -> bool:
        return self._since(JSON_FILTERS_FROM)

    @property
    def data_parser(self) -> str | None:
        return PINNED_DATA_PARSER if self._since(PINNED_DATA_PARSER_FROM) else None

    @property
    def expedited_requeue(self) -> bool:
        return self._since(EXPEDITED_REQUEUE_FROM)

    @property
    def openmetrics(self) -> bool:
        return self._since(OPENMETRICS_FROM)

    def json_flag(self) -> str:
        """``--json``, with the pinned data_parser where this release has it."""
        return f"--json={self.data_parser}" if self.data_parser else "--json"

    def lacks(self) -> list[str]:
        """What this release does not give the supervisor, in words for the daemon's log."""
        missing = []
        if not self.json_filters:
            missing.append("filtered --json reads (jobs and nodes are read as formatted text)")
        if not self.expedited_requeue:
            missing.append("expedited requeue (sbatch --requeue=expedite, 25.11+)")
        if not self.openmetrics:
            missing.append("slurmctld's own OpenMetrics endpoint (25.11+)")
        return missing


def parse_version(text: str) -> tuple[int, int] | None:
    """(major, minor) from ``squeue --version`` ("slurm-wlm 22.05.8", "slurm 24.05.2")."""
    for word in text.split():
        parts = word.split(".")
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            return int(parts[0]), int(parts[1])
    return None
