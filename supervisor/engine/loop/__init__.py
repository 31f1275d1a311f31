"""The daemon's loop around the tick: how long to wait, leadership among login nodes, clean stop."""
