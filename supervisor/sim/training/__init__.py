"""The simulated training run and its world: trainer, launcher, saves, time limits, settings, results."""
