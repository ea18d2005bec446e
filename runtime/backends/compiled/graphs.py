"""Graph functions compiled once per key and reused.

A key names one graph ("block[csa] S=2"). Each is compiled with torch.compile
(fullgraph: a graph break or a host sync is an error) where the mode is "compile", or
run as it is where it is "eager" (npu, `--enforce-eager`). The dimensions that vary
from call to call (the rows in use, the entries of a context bucket) are marked
dynamic, so one graph serves every size but 1. Inductor's compile cache lives on disk
(V4SERVE_CACHE_DIR, default ~/.cache/v4serve), so a second start reuses it.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

log = logging.getLogger("v4serve.graphs")
MODES = ("compile", "cudagraph", "eager")


def cache_dir() -> Path:
    return Path(os.environ.get("V4SERVE_CACHE_DIR", Path.home() / ".cache" / "v4serve"))


def _configure() -> None:
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir() / "inductor"))
    torch._dynamo.config.cache_size_limit = 256
    torch._dynamo.config.accumulated_cache_size_limit = 4096
    torch._dynamo.config.automatic_dynamic_shapes = False   # only what we mark varies


def default_mode(device: torch.device) -> str:
    return {"cpu": "compile", "cuda": "cudagraph"}.get(device.type, "eager")


class Graphs:
    """The graph functions of one backend, by key. In "cudagraph" mode the graphs are
    compiled as in "compile"; the backend captures whole launches over them."""

    def __init__(self, mode: str):
        if mode not in MODES:
            raise ValueError(f"graph mode {mode!r}; one of {', '.join(MODES)}")
        if mode != "eager":
            _configure()
        self.mode = mode
        self.seconds: dict[str, float] = {}      # key -> seconds of its first call
        self._fns: dict[str, Callable] = {}

    @property
    def compiling(self) -> bool:
        return self.mode != "eager"

    def run(self, key: str, fn: Callable, *args, dynamic: tuple[torch.Tensor, ...] = ()):
        """fn(*args) through the graph of `key`; `dynamic` tensors vary in dim 0."""
        if not self.compiling:
            return fn(*args)
        for tensor in dynamic:      # a size of 1 is a graph of its own (the compiler
            if tensor.shape[0] > 1:   # specializes it), every other size shares one
                torch._dynamo.mark_dynamic(tensor, 0)
        compiled = self._fns.get(key)
        if compiled is not None:
            return compiled(*args)
        compiled = self._fns[key] = torch.compile(fn, fullgraph=True, dynamic=None)
        start = time.perf_counter()
        result = compiled(*args)
        self.seconds[key] = time.perf_counter() - start
        log.info("graph %s compiled in %.1f s", key, self.seconds[key])
        return result
