"""Node health: agent reports, the GPU rules that judge them, findings, and the bad-node quarantine."""
