"""The watchers a tick consults per run: training logs, pace, loss spikes, checkpoints and the resume choice."""
