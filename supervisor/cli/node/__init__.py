"""The commands that run on a run's nodes or in its job: the node agent, the launcher, the Slurm hooks, ckpt."""
