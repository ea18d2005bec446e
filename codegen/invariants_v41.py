"""The checks that span fields of a DeepSeek V4.1 spec: layer roles and their sources,
candidate blocks, Engram tables, DSpark stages. `invariants.py` runs them beside the
checks both families share; each yields (field path, message).

The official code checks none of the source rules below; both released configs keep
them, and the pool plan and the forward's shared slots assume them.
"""
from __future__ import annotations

from collections.abc import Iterator

from codegen.schema_v41 import ModelSectionV41, SpecV41
from codegen.yaml_loader import FieldPath
from contract.engram_primes import engram_rows
from contract.layer_roles import latest

Problem = tuple[FieldPath, str]
LAYER_LISTS = ("kv_source_layer_ids", "index_source_layer_ids", "engram_layer_ids",
               "dspark_target_layer_ids")


def check_v41_model(m: ModelSectionV41) -> Iterator[Problem]:
    """The model section's own V4.1 invariants (compress_ratios has its length)."""
    n = m.num_hidden_layers
    for i in range(n, len(m.compress_ratios)):
        if m.compress_ratios[i]:
            yield (("model", "compress_ratios", i),
                   f"DSpark stage {i} must be window only (0), not {m.compress_ratios[i]}")
    listed = list(_layer_lists(m))
    yield from listed
    if listed:          # the source rules below index layers by these lists
        return
    yield from _kv_sources(m)
    yield from _index_sources(m)
    yield from _consumers(m)
    yield from _candidates(m)
    yield from _engram(m)
    yield from _dspark(m)
    if m.index_source_layer_ids and m.index_head_dim < m.qk_rope_head_dim:
        yield (("model", "index_head_dim"),
               f"must be at least qk_rope_head_dim {m.qk_rope_head_dim}, not {m.index_head_dim}")


def check_v41_spec(spec: SpecV41) -> Iterator[Problem]:
    """What the V4.1 model asks of the other sections."""
    m, t = spec.model, spec.topology
    stage_experts = m.dspark_n_routed_experts
    if m.num_nextn_predict_layers and stage_experts and t.ep == t.ranks and stage_experts % t.ep:
        yield (("topology", "ep"),
               f"{t.ep} does not divide dspark_n_routed_experts {stage_experts}")
    if spec.weights.engram == "fp8" and m.engram_layer_ids and m.engram_head_dim % 32:
        yield (("weights", "engram"),
               f"fp8 Engram rows take a scale per 32 values: model.engram_head_dim "
               f"{m.engram_head_dim} is not a multiple of 32")
    for i, k in enumerate(spec.decode.num_speculative_tokens):
        if m.num_nextn_predict_layers and k > m.dspark_block_size:
            yield (("decode", "num_speculative_tokens", i),
                   f"K={k} exceeds dspark_block_size {m.dspark_block_size}: a DSpark block "
                   f"drafts {m.dspark_block_size} tokens")


def _layer_lists(m: ModelSectionV41) -> Iterator[Problem]:
    """Every layer list names backbone layers, ascending, once each."""
    for key in LAYER_LISTS:
        values = getattr(m, key)
        for j, layer in enumerate(values):
            if layer >= m.num_hidden_layers:
                yield (("model", key, j), f"{layer} is not a backbone layer "
                                          f"(0..{m.num_hidden_layers - 1})")
            elif j and layer <= values[j - 1]:
                yield (("model", key, j), f"{layer} follows {values[j - 1]}: list each layer "
                                          "once, ascending")


def _kv_sources(m: ModelSectionV41) -> Iterator[Problem]:
    for j, layer in enumerate(m.kv_source_layer_ids):
        at = ("model", "kv_source_layer_ids", j)
        if not m.compress_ratios[layer]:
            yield (at, f"layer {layer} has compress ratio 0: a kv source owns a compressor, "
                       "so its ratio must be positive")
        elif layer not in m.index_source_layer_ids:
            yield (at, f"layer {layer} is not in index_source_layer_ids: a kv source's index "
                       "keys are scored by its own indexer")


def _index_sources(m: ModelSectionV41) -> Iterator[Problem]:
    for j, layer in enumerate(m.index_source_layer_ids):
        at = ("model", "index_source_layer_ids", j)
        if not m.compress_ratios[layer]:
            yield (at, f"layer {layer} has compress ratio 0: an index source selects "
                       "compressed entries, so its ratio must be positive")
        elif latest(m.kv_source_layer_ids, layer) is None:
            yield (at, f"layer {layer} is neither a kv source nor preceded by one "
                       f"(kv_source_layer_ids {m.kv_source_layer_ids}): a Reindex layer "
                       "scores the latest kv source's index keys")


def _consumers(m: ModelSectionV41) -> Iterator[Problem]:
    """Every compressed layer reads the latest kv source at or below it, of its ratio."""
    for layer in range(m.num_hidden_layers):
        ratio = m.compress_ratios[layer]
        source = latest(m.kv_source_layer_ids, layer)
        at = ("model", "compress_ratios", layer)
        if not ratio:
            continue
        if source is None:
            yield (at, f"layer {layer} has ratio {ratio} but no kv source at or below it "
                       f"(kv_source_layer_ids {m.kv_source_layer_ids}): its compressed KV "
                       "would come from nowhere")
        elif m.compress_ratios[source] != ratio:
            yield (at, f"layer {layer} has ratio {ratio} but reads kv source {source} of "
                       f"ratio {m.compress_ratios[source]}: a layer reads its source's "
                       "entries, so their ratios must agree")


def _candidates(m: ModelSectionV41) -> Iterator[Problem]:
    """The candidate source is a Full layer; the indexers above it score inside its
    blocks, on its entry axis, and must find index_topk entries there."""
    c = m.candidate_source_layer_id
    if c < 0:
        return
    if c not in m.kv_source_layer_ids:
        yield (("model", "candidate_source_layer_id"),
               f"{c} is not a kv source ({m.kv_source_layer_ids}): the candidate blocks come "
               "from a Full layer's own scores")
        return
    for j, layer in enumerate(m.index_source_layer_ids):
        if layer > c and m.compress_ratios[layer] != m.compress_ratios[c]:
            yield (("model", "index_source_layer_ids", j),
                   f"layer {layer} scores inside candidate source {c}'s blocks of ratio-"
                   f"{m.compress_ratios[c]} entries, but its own entries are ratio "
                   f"{m.compress_ratios[layer]}")
    reach = (m.candidate_topk_blocks - 1) * m.candidate_block_size + 1
    if reach < m.index_topk:
        yield (("model", "candidate_topk_blocks"),
               f"({m.candidate_topk_blocks} - 1) * candidate_block_size "
               f"{m.candidate_block_size} + 1 = {reach} is below index_topk {m.index_topk}: "
               "an indexer above the candidate source would select entries outside its "
               "candidate blocks")


def _engram(m: ModelSectionV41) -> Iterator[Problem]:
    layers, rows = m.engram_layer_ids, m.engram_num_embeddings
    if len(rows) != len(layers):
        yield (("model", "engram_num_embeddings"),
               f"has {len(rows)} entries; need one per engram_layer_ids entry ({len(layers)})")
    elif layers:
        want = engram_rows(m.engram_vocab_size, m.engram_n_heads, m.engram_max_ngram_size,
                           len(layers))
        for j, (got, primes) in enumerate(zip(rows, want, strict=True)):
            if got != primes:
                yield (("model", "engram_num_embeddings", j),
                       f"{got} must be the sum of layer {layers[j]}'s hash primes, {primes} "
                       f"(engram_vocab_size {m.engram_vocab_size}, {m.engram_n_heads} heads, "
                       f"n-grams 2..{m.engram_max_ngram_size})")
    if m.engram_pad_token_id >= m.vocab_size:
        yield (("model", "engram_pad_token_id"),
               f"{m.engram_pad_token_id} is outside vocab_size {m.vocab_size}")
    if m.engram_compressed_vocab_size > m.vocab_size:
        yield (("model", "engram_compressed_vocab_size"),
               f"{m.engram_compressed_vocab_size} exceeds vocab_size {m.vocab_size}: the "
               "compressed token map folds the vocabulary")


def _dspark(m: ModelSectionV41) -> Iterator[Problem]:
    if not m.num_nextn_predict_layers:
        return
    if not m.dspark_target_layer_ids:
        yield (("model", "dspark_target_layer_ids"),
               "the DSpark stages need at least one target layer")
    if m.dspark_noise_token_id >= m.vocab_size:
        yield (("model", "dspark_noise_token_id"),
               f"{m.dspark_noise_token_id} is outside vocab_size {m.vocab_size}")
    experts = m.dspark_n_routed_experts or m.n_routed_experts
    if m.dspark_num_experts_per_tok > experts:
        yield (("model", "dspark_num_experts_per_tok"),
               f"{m.dspark_num_experts_per_tok} exceeds the stages' {experts} routed experts")
