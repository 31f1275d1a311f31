"""The instance's local API: the CLI asks the daemon over a Unix socket instead of writing its
database. The kernel names each caller (``SO_PEERCRED``); ``access`` decides what that caller may
do; ``ops`` does it on the daemon's store, signed with the caller's passwd name; ``server`` and
``client`` carry one JSON line each way (``wire``)."""
