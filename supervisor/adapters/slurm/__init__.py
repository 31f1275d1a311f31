"""Slurm: argv builders, pure parsers of its JSON and formatted output, one runner; sacct; the slurmd probe."""
