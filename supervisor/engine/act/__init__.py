"""What a tick does: the one writer (records applied, actions journaled and performed), intents, swaps."""
