"""The role of every layer of a DeepSeek V4.1 model (CSA2 attention), from its config.

    role     layers                       owns                     reads
    window   ratio 0 (backbone)           its window               -
    full     kv_source_layers             window, compressor,      -
                                          compressed KV, index
                                          keys, indexer
    reindex  index_source_layers that     window, indexer          the latest kv source's
             are no kv source             (wq_b, weights_proj)     compressed KV, index keys
    reuse    ratio > 0, in neither list   window                   the latest kv source's
                                                                   compressed KV, the latest
                                                                   index source's top-k
    dspark   the DSpark stages (ids       a window of main_kv      -
             n_layers..)                  rows

"Latest" is the greatest source id at or below the layer: the sources run in layer order
within one forward, each overwriting the one shared slot its consumers read. Every layer,
whatever its role, keeps its own window. Torch-free.
"""
from __future__ import annotations

from collections.abc import Sequence

WINDOW, FULL, REINDEX, REUSE, DSPARK = "window", "full", "reindex", "reuse", "dspark"
ROLES = (WINDOW, FULL, REINDEX, REUSE, DSPARK)


def layer_role(layer: int, n_layers: int, ratio: int, kv_sources: Sequence[int],
               index_sources: Sequence[int]) -> str:
    """The role of `layer` (a backbone layer below `n_layers`, or a DSpark stage)."""
    if layer >= n_layers:
        return DSPARK
    if layer in kv_sources:
        return FULL
    if layer in index_sources:
        return REINDEX
    return REUSE if ratio > 0 else WINDOW


def latest(sources: Sequence[int], layer: int) -> int | None:
    """The greatest of `sources` at or below `layer`; None when none is."""
    below = [s for s in sources if s <= layer]
    return max(below) if below else None
