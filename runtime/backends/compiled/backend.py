"""The compiled backend: the four kernel kinds as calls of per-layer graphs.

Each model the backend sees is wrapped once in a CompiledModel (its layers as graph
arguments); each launch runs kernels.<kind> on the rows it carries. On cuda, a decode
launch is one CUDA graph per (kernel, context bucket, row count padded to a multiple of
the decode batch), captured on first use and replayed after: the launch's row index is
copied into the graph's static buffer, every other input already sits in the launcher's
staging buffers. Graphs compile on first use, or at warmup; see graphs.py.
"""
from __future__ import annotations

import numpy as np
import torch

from contract.abi import KernelABI
from runtime.backends import Backend
from runtime.backends.compiled import expert_parallel, kernels
from runtime.backends.compiled.graphs import Graphs, default_mode
from runtime.backends.compiled.model import CompiledModel


class CompiledBackend(Backend):
    name = "compiled"

    def __init__(self, mode: str | None = None):
        self.mode = mode                 # None: by device (compile on cpu, cudagraph on cuda)
        # --enforce-eager runs "compiled-eager" instead (trace mode stays: a check)
        self.eager_variant = None if mode in ("eager", "trace") else "compiled-eager"
        # its MoE runs over expert_parallel's group; trace mode (a check) in one process
        self.distributed = mode != "trace"
        self.defer = False               # graphs not compiled yet run eagerly (see graphs.py)
        self.graphs: Graphs | None = None
        self._models: dict[int, CompiledModel] = {}
        self._captured: dict[tuple, _Captured] = {}

    def compiles(self, device: torch.device) -> bool:
        """Whether launches on `device` run through compiled (or traced) graphs: only
        then has a warm-up anything to do."""
        return (self.mode or default_mode(device)) != "eager"

    def model(self, kernel: KernelABI, weights) -> CompiledModel:
        """The CompiledModel of these weights (built once per weights object)."""
        if self.graphs is None:
            self.graphs = Graphs(self.mode or default_mode(weights.device), defer=self.defer)
        model = self._models.get(id(weights))
        if model is None or model.params is not weights:
            model = self._models[id(weights)] = CompiledModel(weights, dict(kernel.groups),
                                                              self.graphs)
        return model

    def launch(self, kernel: KernelABI, args) -> None:
        model = self.model(kernel, args.weights)
        run = kernels.BY_KIND[kernel.kind]
        with torch.inference_mode():
            if kernel.kind == "prefill_main":
                run(model, kernel, args)
                return
            if expert_parallel.active() and kernel.kind.startswith("decode"):
                with expert_parallel.fixed_rows():      # every rank: every row of the layout
                    self._decode(model, kernel, args, _every_row(args), run)
                return
            rows = args.live
            if not len(rows):
                if not expert_parallel.active() or kernel.kind == "prefill_mtp":
                    return
                rows = np.zeros(1, np.int64)   # an empty row: its MoE joins the others'
                # collectives, its writes land on scratch pages
            if kernel.kind.startswith("decode"):
                self._decode(model, kernel, args, rows, run)
                return
            run(model, kernel, args, torch.from_numpy(rows).to(_device(args)))

    def _decode(self, model: CompiledModel, kernel: KernelABI, args, rows: np.ndarray,
                run) -> None:
        """A decode launch on `rows`: replayed from a CUDA graph, or run."""
        if self.graphs.mode == "cudagraph":
            self._replay(model, kernel, args, rows, run)
        else:
            run(model, kernel, args, torch.from_numpy(rows).to(_device(args)))

    def _replay(self, model: CompiledModel, kernel: KernelABI, args, rows: np.ndarray,
                run) -> None:
        batch = args.logits.shape[1]
        padded = -(-len(rows) // batch) * batch
        key = (kernel.name, kernel.context_bucket(args.context), padded, id(args.logits))
        captured = self._captured.get(key)
        if captured is None:
            captured = self._captured[key] = _Captured(padded, _device(args))
        captured.index[: len(rows)].copy_(torch.from_numpy(rows))
        captured.index[len(rows):].copy_(_padding(kernel, args, padded - len(rows)))
        captured.run(lambda index: run(model, kernel, args, index))


class _Captured:
    """A CUDA graph of one decode launch shape over a static row-index buffer: the
    first run captures (after a warm-up run), every later run replays."""

    def __init__(self, rows: int, device: torch.device):
        self.index = torch.zeros(rows, dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None

    def run(self, launch) -> None:
        if self.graph is None:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                launch(self.index)                 # compiles, settles allocations
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                launch(self.index)
        self.graph.replay()


def _every_row(args) -> np.ndarray:
    """Every row of a launch, empty ones included (their writes land on scratch pages)."""
    return np.arange(args.logits.shape[0] * args.logits.shape[1])


def _padding(kernel: KernelABI, args, count: int) -> torch.Tensor:
    """Row indices of empty rows (their writes land on scratch pages), `count` of them."""
    rows = args.logits.shape[0] * args.logits.shape[1]
    empty = np.setdiff1d(np.arange(rows), args.live)[:count]
    return torch.from_numpy(empty)


def _device(args) -> torch.device:
    return args.pool_ori.device
