"""The commands people run against their instance's daemon: submit, status, cancel, nodes, logbook, quarantine."""
