"""Trainer-side helpers: code that runs inside a training job, not in the supervisor daemon.

Nothing here imports the rest of the package, so a trainer may also copy a module into its own
code base instead of installing slurm-supervisor into its environment.
"""
