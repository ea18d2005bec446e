"""The compiled backend: the V4 forward as static-shape, loop-free graphs.

rows        one graph call's token rows (N rows of S tokens) as tensors
paged       a pool group through a call's block tables: gathers and masked writes
compressor  CSA/HCA compressors over whole rows, candidate entries masked
attention   window gather, HCA entries, CSA indexer top-k, sink softmax
moe         routed experts by dispatch, grouped matmuls and combine
forward     the main model and MTP block over rows
kernels     the four kernel kinds as graph functions
graphs      compile once per key (torch.compile, CUDA graphs) or run eagerly
backend     the launch: bucket choice, the prefill tile walk, outputs
"""
from __future__ import annotations

from runtime.backends.compiled.backend import CompiledBackend

__all__ = ["CompiledBackend"]
