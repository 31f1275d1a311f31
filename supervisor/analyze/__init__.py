"""Offline analysis: finished training logs replayed through the daemon's own watches (``slurm-supervisor analyze``)."""
