"""A private multi-node Slurm on this host (accounting included), the daemon against it, local accounts."""
