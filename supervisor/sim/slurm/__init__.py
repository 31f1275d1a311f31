"""The simulated Slurm controller and nodes (the ``Scheduler`` port on a virtual clock), its probe and fence."""
