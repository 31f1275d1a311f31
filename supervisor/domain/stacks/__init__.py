"""A hang's Python stacks, read: each rank's dump (``dumps``), where it waits (``places``), and who
is outside the collective the others wait in (``verdict``). Pure; docs/hang-stacks.md."""
