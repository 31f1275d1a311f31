"""Loss spikes: the detector, its watches and trajectories, divergence, and the rollback choice."""
