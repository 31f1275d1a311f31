"""The services and their upkeep: the daemon, the node guard, doctor, the store."""
