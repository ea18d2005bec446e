"""v4serve server: the OpenAI-compatible HTTP API (app, protocol, responses, chat,
metrics), `v4serve serve` (cli) and the `v4serve` command's root (command)."""
