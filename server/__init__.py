"""v4serve server: the `v4serve` command line (and, with the server issue, the HTTP API)."""
