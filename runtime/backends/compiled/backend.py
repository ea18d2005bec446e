"""The compiled backend: the four kernel kinds as calls of per-layer graphs.

Each model the backend sees is wrapped once in a CompiledModel (its layers as graph
arguments); each launch runs kernels.<kind>. Graphs compile on first use, or at
warmup (runtime/model_runner.py), and the compile cache persists on disk.
"""
from __future__ import annotations

import torch

from runtime.abi import KernelABI
from runtime.backends.compiled import kernels
from runtime.backends.compiled.graphs import Graphs, default_mode
from runtime.backends.compiled.model import CompiledModel


class CompiledBackend:
    name = "compiled"

    def __init__(self, mode: str | None = None):
        self.mode = mode                 # None: by device (compile on cpu, cudagraph on cuda)
        self.graphs: Graphs | None = None
        self._models: dict[int, CompiledModel] = {}

    def model(self, kernel: KernelABI, weights) -> CompiledModel:
        """The CompiledModel of these weights (built once per weights object)."""
        if self.graphs is None:
            self.graphs = Graphs(self.mode or default_mode(weights.device))
        model = self._models.get(id(weights))
        if model is None or model.params is not weights:
            model = self._models[id(weights)] = CompiledModel(weights, dict(kernel.groups),
                                                              self.graphs)
        return model

    def launch(self, kernel: KernelABI, args) -> None:
        with torch.inference_mode():
            getattr(kernels, kernel.kind)(self.model(kernel, args.weights), kernel, args)
