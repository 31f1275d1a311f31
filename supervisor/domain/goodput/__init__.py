"""Goodput (ETTR): where a run's wall time went, interruptions by cause, and Young/Daly advice."""
