"""v4serve runtime: launch ABI support, backends, and (later) scheduler, pools and engine."""
