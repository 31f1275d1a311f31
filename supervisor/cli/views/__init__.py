"""What the commands print: plain text and JSON of runs, nodes, the logbook, the status screen, analyze."""
