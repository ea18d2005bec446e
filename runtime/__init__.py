"""v4serve runtime: the launch ABI the generated wrappers use, the kernel backends, the
V4 forward (model/), the torch-free scheduler and block pools, the model runner, the
engine and its async front; `v4serve generate` and `v4serve compile` (cli)."""
