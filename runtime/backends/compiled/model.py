"""One loaded model as the compiled backend runs it: its layers as graph arguments and
the graph calls of the main model, the MTP block and the heads.

A call's rows are N rows of S tokens: `ids` [N, S], `start`, `length`, `rank` [N] and
block tables [N, width] per group. N varies from call to call (the rows in use); the
graphs are compiled with N (and the entry count E) dynamic, so one graph per layer kind
and row width S serves every call.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from contract.abi import PoolGroup
from runtime.backends.compiled import forward
from runtime.backends.compiled.graphs import Graphs
from runtime.model.params import ModelParams

RATIO = {"csa": 4, "hca": 128}


@dataclass(frozen=True)
class Call:
    """The rows of one graph call."""

    ids: torch.Tensor                     # [N, S] int64
    start: torch.Tensor                   # [N] int64
    length: torch.Tensor                  # [N] int64
    rank: torch.Tensor                    # [N] int64
    tables: dict[str, torch.Tensor]       # group -> [N, width] int64

    def dynamic(self) -> tuple[tuple[torch.Tensor, int], ...]:
        """(tensor, dim): the dimensions that are the call's row count."""
        return tuple((t, 0) for t in (self.ids, self.start, self.length, self.rank,
                                      *self.tables.values()))


class CompiledModel:
    def __init__(self, params: ModelParams, groups: dict[str, PoolGroup], graphs: Graphs):
        self.params, self.groups, self.graphs = params, groups, graphs
        self.args = params.args
        self.layers = forward.layers(params, groups)
        self.main_layers = self.layers[: self.args.n_layers]
        self.mtp_layer = self.layers[self.args.n_layers] if self.args.n_mtp_layers else None

    # -- the pieces ------------------------------------------------------------------

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [N, S] -> the hc_mult streams [N, S, hc, dim]."""
        h = self.params["embed.weight"][ids]
        return h.unsqueeze(-2).expand(*h.shape[:-1], self.args.hc_mult, h.shape[-1])

    def block(self, layer: forward.Layer, h: torch.Tensor, call: Call,
              pools: dict[str, torch.Tensor], bucket: int) -> torch.Tensor:
        entries = self._entries(layer.kind, bucket, h.device)
        pools = {g: pools[g] for g in layer.where}
        return self.graphs.run(
            f"block[{layer.graph}] S={call.ids.shape[1]}", forward.block, self.args,
            layer.kind, layer.hashed, self.groups, layer.splits, h, call.ids, call.start,
            call.length, call.rank, call.tables, pools, layer.where, layer.weights,
            layer.experts, layer.inv_freq, entries, owner=id(self),
            dynamic=((h, 0), *call.dynamic(), *_pages(pools),
                     *([] if entries is None else [(entries, 0)])))

    def _entries(self, kind: str, bucket: int, device: torch.device) -> torch.Tensor | None:
        """arange(bucket / ratio) for a compressed layer: the entries a call may read."""
        if kind not in RATIO:
            return None
        return torch.arange(bucket // RATIO[kind], device=device)

    def logits(self, h: torch.Tensor, mtp: bool = False) -> torch.Tensor:
        """Streams [..., hc, dim] -> float32 logits [..., vocab] (the MTP block's own
        hc_head and norm when `mtp`; the main model's head either way)."""
        w = self.mtp_layer.weights if mtp else self.params.dense
        key = "mtp_head" if mtp else "head"
        flat = h.reshape(-1, *h.shape[-2:])
        out = self.graphs.run(key, forward.head, self.args, flat, w["hc_head_fn"],
                              w["hc_head_base"], w["hc_head_scale"], w["norm.weight"],
                              self.params["head.weight"], dynamic=((flat, 0),),
                              owner=id(self))
        return out.view(*h.shape[:-2], -1)

    # -- whole passes ----------------------------------------------------------------

    def main(self, call: Call, pools: dict[str, torch.Tensor], bucket: int) -> torch.Tensor:
        """The main model on the call's tokens -> pre-hc_head streams [N, S, hc, dim]."""
        h = self.embed(call.ids)
        for layer in self.main_layers:            # one graph call per layer
            h = self.block(layer, h, call, pools, bucket)
        return h

    def mtp(self, h: torch.Tensor, call: Call, pools: dict[str, torch.Tensor],
            bucket: int) -> torch.Tensor:
        """The MTP block on main streams h [N, S, hc, dim] whose next tokens are
        call.ids -> the block's streams (their logits draft position + 2)."""
        w = self.mtp_layer.weights
        x = forward.mtp_input(self.args, w, self.params["embed.weight"], h, call.ids)
        return self.block(self.mtp_layer, x, call, pools, bucket)

    def mtp_kv(self, h: torch.Tensor, call: Call, pool: torch.Tensor) -> None:
        """The MTP layer's sliding KV of the call's rows from main streams h."""
        layer = self.mtp_layer
        self.graphs.run(f"mtp_kv S={call.ids.shape[1]}", forward.mtp_kv, self.args,
                        self.groups, h, call.ids, call.start, call.length, call.rank,
                        call.tables["ori"], pool, layer.where["ori"], layer.weights,
                        self.params["embed.weight"], layer.inv_freq, owner=id(self),
                        dynamic=((h, 0), *call.dynamic(), (pool, 2)))


def _pages(pools: dict[str, torch.Tensor]) -> tuple[tuple[torch.Tensor, int], ...]:
    """A pool's page count (dimension 2) depends on the memory given to the cache: it
    varies, so one graph serves every capacity."""
    return tuple((pool, 2) for pool in pools.values())
