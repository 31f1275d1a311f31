"""The daemon's HTTP endpoint: listener, protocol, server, pages and their renderer, tokens, report ingest, the launcher channel."""
