"""What a tick reads: one snapshot of facts from Slurm, the node probes and agents, the job list, accounting."""
