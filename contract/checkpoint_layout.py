"""The tensors of a checkpoint of a V4 or V4.1 architecture, from its config alone: every
name with its shape, and which of them the release stores quantized. Torch-free: the
loader checks a checkpoint against it, and the memory plan weighs a deployment by it
before any weight exists.

V4.1 differs (runtime/model/V41.md section 7): no hc_head, ape, tid2eid or MTP
e_proj/h_proj/enorm/hnorm; a compressor (wgate only at ratio > 1) and indexer wk/k_norm on
the kv sources alone, indexer wq_b/weights_proj on the index sources; Engram tables
(FP8 e4m3 with an e8m0 scale per 32) and their gate on the Engram layers; DSpark's
main_proj/main_norm on the first stage and its norm, Markov head and confidence head on
the last; FP8 scales per 32 x 32 block. The vision tower, aligner, image_* tensors and
ffn.gate.bias_vl of a release are not listed: a text-only loader skips them."""
from __future__ import annotations

from contract.model_args import ModelArgs

FP8_BLOCK = 128        # an FP8 weight's scale covers a 128 x 128 block (V4)
V41_FP8_BLOCK = 32     # ... a 32 x 32 block (V4.1)
ENGRAM_SCALE_GROUP = 32  # an Engram table row's e8m0 scale covers 32 values
FP4_GROUP = 32         # an FP4 weight's scale covers 32 inputs of a row
STACK_CHUNK = 16       # FP4 experts dequantized at once on the device (the kernels and
                       # the memory plan's count of their temporaries)

# Matrices the release stores in FP8 but the device never holds quantized: the
# embedding (a gather), the head and the router (read whole, in float32). Every other
# 2-D `.weight` outside the routed experts is an FP8 projection in an FP8 release.
DEQUANTIZED_AT_LOAD = ("embed.weight", "head.weight", "ffn.gate.weight")


def keeps_float32(name: str, ndim: int) -> bool:
    """Vectors, mHC tensors and compressor position biases stay float32 on the device;
    other float tensors take the compute dtype."""
    return ndim == 1 or "hc_" in name or name.endswith(".ape")


def is_routed_expert(name: str) -> bool:
    return ".experts." in name and ".shared_experts." not in name


# V4.1: the matrices its FP8 release stores in FP8 (read from model.py's module dtypes;
# the V4.1 convert.py was not available). wo_a, indexer wk and weights_proj, the ratio-1
# compressor, the Markov and confidence heads stay bfloat16; the Engram tables are FP8
# of their own kind (is_engram_table).
V41_FP8_PROJECTIONS = (".attn.wq_a.weight", ".attn.wq_b.weight", ".attn.wkv.weight",
                       ".attn.wo_b.weight", ".indexer.wq_b.weight", ".engram.wkv.weight",
                       ".shared_experts.w1.weight", ".shared_experts.w2.weight",
                       ".shared_experts.w3.weight", ".main_proj.weight")


def is_fp8_projection(name: str, shape: tuple[int, ...]) -> bool:
    """A matrix a V4 FP8 release stores in FP8 and the device may hold so."""
    return len(shape) == 2 and name.endswith(".weight") and not is_routed_expert(name) \
        and not name.endswith(DEQUANTIZED_AT_LOAD) and not is_engram_table(name)


def is_v41_fp8_projection(name: str) -> bool:
    """A matrix a V4.1 FP8 release stores in FP8 (a scale per V41_FP8_BLOCK square)."""
    return name.endswith(V41_FP8_PROJECTIONS)


def is_engram_table(name: str) -> bool:
    """An Engram table (F8_E4M3 [rows, head_dim]) or its e8m0 scales [rows, head_dim/32]."""
    return name.endswith((".engram.embed.weight", ".engram.embed.scale"))


def fp8_block(args: ModelArgs) -> int:
    """The side of the square an FP8 weight's scale covers."""
    return V41_FP8_BLOCK if args.is_v41 else FP8_BLOCK


def expected_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """Every tensor name of a checkpoint of this architecture, with its shape."""
    if args.is_v41:
        return _v41_shapes(args)
    d = args.dim
    shapes = {
        "embed.weight": (args.vocab_size, d), "head.weight": (args.vocab_size, d),
        "norm.weight": (d,), **_hc_head("", args),
    }
    for layer in range(args.n_layers + args.n_mtp_layers):
        prefix = args.prefix(layer)
        shapes.update({prefix + k: v for k, v in _layer_shapes(args, layer).items()})
        if layer >= args.n_layers:
            shapes.update({
                prefix + "e_proj.weight": (d, d), prefix + "h_proj.weight": (d, d),
                prefix + "enorm.weight": (d,), prefix + "hnorm.weight": (d,),
                prefix + "norm.weight": (d,), **_hc_head(prefix, args),
            })
    return shapes


def _hc_head(prefix: str, args: ModelArgs) -> dict[str, tuple[int, ...]]:
    hc = args.hc_mult
    return {prefix + "hc_head_fn": (hc, hc * args.dim), prefix + "hc_head_base": (hc,),
            prefix + "hc_head_scale": (1,)}


def _layer_shapes(args: ModelArgs, layer: int) -> dict[str, tuple[int, ...]]:
    shapes = _block_shapes(args)
    kind = args.kind(layer)
    D, d = args.head_dim, args.dim
    if kind in ("csa", "hca"):
        shapes.update(_compressor("attn.compressor.", args.ratio(layer), D, d))
    if kind == "csa":
        DI, HI = args.index_head_dim, args.index_heads
        shapes.update(_compressor("attn.indexer.compressor.", args.ratio(layer), DI, d))
        shapes.update({"attn.indexer.wq_b.weight": (HI * DI, args.q_lora_rank),
                       "attn.indexer.weights_proj.weight": (HI, d)})
    shapes.update(_ffn_shapes(args, layer))
    return shapes


def _block_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """What every layer has, of either family: norms, mHC mixes, the attention's
    projections and sink."""
    d, hc, D, H = args.dim, args.hc_mult, args.head_dim, args.n_heads
    mix = (2 + hc) * hc
    shapes: dict[str, tuple[int, ...]] = {"attn_norm.weight": (d,), "ffn_norm.weight": (d,)}
    for site in ("attn", "ffn"):
        shapes.update({f"hc_{site}_fn": (mix, hc * d), f"hc_{site}_base": (mix,),
                       f"hc_{site}_scale": (3,)})
    shapes.update({
        "attn.wq_a.weight": (args.q_lora_rank, d), "attn.q_norm.weight": (args.q_lora_rank,),
        "attn.wq_b.weight": (H * D, args.q_lora_rank), "attn.wkv.weight": (D, d),
        "attn.kv_norm.weight": (D,), "attn.attn_sink": (H,),
        "attn.wo_a.weight": (args.o_groups * args.o_lora_rank, H * D // args.o_groups),
        "attn.wo_b.weight": (d, args.o_groups * args.o_lora_rank),
    })
    return shapes


def _compressor(prefix: str, ratio: int, width: int, d: int) -> dict[str, tuple[int, ...]]:
    coff = 2 if ratio == 4 else 1
    return {prefix + "wkv.weight": (coff * width, d), prefix + "wgate.weight": (coff * width, d),
            prefix + "ape": (ratio, coff * width), prefix + "norm.weight": (width,)}


def _ffn_shapes(args: ModelArgs, layer: int) -> dict[str, tuple[int, ...]]:
    d, inter, shared = args.dim, args.moe_inter, args.moe_inter * args.n_shared_experts
    experts = args.experts(layer)
    shapes: dict[str, tuple[int, ...]] = {"ffn.gate.weight": (experts, d)}
    if args.is_hash(layer):
        shapes["ffn.gate.tid2eid"] = (args.vocab_size, args.n_active)
    else:
        shapes["ffn.gate.bias"] = (experts,)
    for e in range(experts):
        shapes.update({f"ffn.experts.{e}.w1.weight": (inter, d),
                       f"ffn.experts.{e}.w2.weight": (d, inter),
                       f"ffn.experts.{e}.w3.weight": (inter, d)})
    shapes.update({"ffn.shared_experts.w1.weight": (shared, d),
                   "ffn.shared_experts.w2.weight": (d, shared),
                   "ffn.shared_experts.w3.weight": (shared, d)})
    return shapes


def _v41_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    d = args.dim
    shapes = {"embed.weight": (args.vocab_size, d), "head.weight": (args.vocab_size, d),
              "norm.weight": (d,)}
    for layer in range(args.n_layers + args.n_mtp_layers):
        prefix = args.prefix(layer)
        shapes.update({prefix + k: v for k, v in _v41_layer_shapes(args, layer).items()})
    shapes.update(_dspark_shapes(args))
    return shapes


def _v41_layer_shapes(args: ModelArgs, layer: int) -> dict[str, tuple[int, ...]]:
    """A backbone layer or DSpark stage: V4's norms, mHC and attention projections, then
    what its role owns, its Engram and its MoE (no hash routing)."""
    d, D, DI = args.dim, args.head_dim, args.index_head_dim
    shapes = _block_shapes(args)
    if layer in args.kv_source_layers:
        shapes.update({"attn.compressor.wkv.weight": (D, d),
                       "attn.compressor.norm.weight": (D,),
                       "attn.indexer.wk.weight": (DI, D), "attn.indexer.k_norm.weight": (DI,)})
        if args.ratio(layer) > 1:
            shapes["attn.compressor.wgate.weight"] = (D, d)
    if layer < args.n_layers and layer in args.index_source_layers:
        shapes.update({"attn.indexer.wq_b.weight": (args.index_heads * DI, args.q_lora_rank),
                       "attn.indexer.weights_proj.weight": (args.index_heads, d)})
    if layer in args.engram_layers:
        shapes.update(_engram_shapes(args, args.engram_layers.index(layer)))
    shapes.update(_ffn_shapes(args, layer))
    return shapes


def _engram_shapes(args: ModelArgs, index: int) -> dict[str, tuple[int, ...]]:
    rows, width, hc = args.engram_num_embeddings[index], args.engram_head_dim, args.hc_mult
    grams = (args.engram_max_ngram - 1) * args.engram_heads * width
    return {"engram.embed.weight": (rows, width),
            "engram.embed.scale": (rows, width // ENGRAM_SCALE_GROUP),
            "engram.wkv.weight": ((hc + 1) * args.dim, grams),
            "engram.q_weight": (hc, args.dim), "engram.k_weight": (hc, args.dim)}


def _dspark_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """The drafter's own tensors: main_proj/main_norm on its first stage; the final norm,
    Markov head (markov_w1: the embedding by token, markov_w2: the projection to the
    vocabulary) and confidence head on its last. The stages share embed and head."""
    if not args.n_mtp_layers:
        return {}
    d, rank = args.dim, args.dspark_markov_rank
    first, last = args.prefix(args.n_layers), args.prefix(args.n_layers + args.n_mtp_layers - 1)
    return {first + "main_proj.weight": (d, len(args.dspark_target_layers) * d),
            first + "main_norm.weight": (d,), last + "norm.weight": (d,),
            last + "markov_head.markov_w1.weight": (args.vocab_size, rank),
            last + "markov_head.markov_w2.weight": (args.vocab_size, rank),
            last + "confidence_head.proj.weight": (1, d + rank)}
