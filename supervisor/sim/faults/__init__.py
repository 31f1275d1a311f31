"""What goes wrong: the failure model, replayed fault traces, the health feed, synthetic loss spikes."""
