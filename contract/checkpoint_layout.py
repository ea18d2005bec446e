"""The tensors of a checkpoint of a V4 architecture, from its config alone: every name
with its shape, and which of them the release stores quantized. Torch-free: the
loader checks a checkpoint against it, and the memory plan weighs a deployment by it
before any weight exists."""
from __future__ import annotations

from contract.model_args import ModelArgs

FP8_BLOCK = 128        # an FP8 weight's scale covers a 128 x 128 block
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


def is_fp8_projection(name: str, shape: tuple[int, ...]) -> bool:
    """A matrix an FP8 release stores in FP8 and the device may hold so."""
    return len(shape) == 2 and name.endswith(".weight") and not is_routed_expert(name) \
        and not name.endswith(DEQUANTIZED_AT_LOAD)


def expected_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """Every tensor name of a checkpoint of this architecture, with its shape."""
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
    kind = args.kind(layer)
    if kind in ("csa", "hca"):
        shapes.update(_compressor("attn.compressor.", args.ratio(layer), D, d))
    if kind == "csa":
        DI, HI = args.index_head_dim, args.index_heads
        shapes.update(_compressor("attn.indexer.compressor.", args.ratio(layer), DI, d))
        shapes.update({"attn.indexer.wq_b.weight": (HI * DI, args.q_lora_rank),
                       "attn.indexer.weights_proj.weight": (HI, d)})
    shapes.update(_ffn_shapes(args, layer))
    return shapes


def _compressor(prefix: str, ratio: int, width: int, d: int) -> dict[str, tuple[int, ...]]:
    coff = 2 if ratio == 4 else 1
    return {prefix + "wkv.weight": (coff * width, d), prefix + "wgate.weight": (coff * width, d),
            prefix + "ape": (ratio, coff * width), prefix + "norm.weight": (width,)}


def _ffn_shapes(args: ModelArgs, layer: int) -> dict[str, tuple[int, ...]]:
    d, inter, shared = args.dim, args.moe_inter, args.moe_inter * args.n_shared_experts
    shapes: dict[str, tuple[int, ...]] = {"ffn.gate.weight": (args.n_experts, d)}
    if args.is_hash(layer):
        shapes["ffn.gate.tid2eid"] = (args.vocab_size, args.n_active)
    else:
        shapes["ffn.gate.bias"] = (args.n_experts,)
    for e in range(args.n_experts):
        shapes.update({f"ffn.experts.{e}.w1.weight": (inter, d),
                       f"ffn.experts.{e}.w2.weight": (d, inter),
                       f"ffn.experts.{e}.w3.weight": (inter, d)})
    shapes.update({"ffn.shared_experts.w1.weight": (shared, d),
                   "ffn.shared_experts.w2.weight": (d, shared),
                   "ffn.shared_experts.w3.weight": (shared, d)})
    return shapes
