"""The commands that need no daemon: simulate, the demo, analyze."""
