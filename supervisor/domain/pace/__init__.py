"""Pace: a job against its own baseline (slowdown) and ranks against their peers (stragglers)."""
