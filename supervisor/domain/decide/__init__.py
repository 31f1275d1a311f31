"""Deciding a run: the policy, the run lifecycle, faults, in-allocation swaps and their limits."""
