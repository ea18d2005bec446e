# @generated from specs/v41-tiny.yaml by codegen — do not edit
"""Serving contract of spec `v41-tiny`: shapes, limits and topology."""
from __future__ import annotations

from contract.decode_layout import DecodeLayout

# Where this package serves its spec otherwise:
# - DEFAULT_NUM_SPECULATIVE_TOKENS 0, not the spec's 1: DeepSeek V4.1's drafter is not launched yet
#   (DSpark: issue 58): its decode kernels serve K = 0 only

# One model replica: attention data parallelism and MoE expert parallelism share the ranks.
RANKS = 4
DP = 4
EP = 4
TP = 1
DEVICE = "cpu"
DTYPE = "float32"
BACKEND = "torch"
EXPERTS_PER_RANK = 2

# Weights: what the release stores (dense projections, routed experts) and how the
# device holds them ("as_released": quantized tensors stay quantized; or a dtype).
WEIGHTS_FORMAT = "as_released"
WEIGHTS_DENSE = "unquantized"
WEIGHTS_EXPERTS = "unquantized"
WEIGHTS_ENGRAM = "fp8"

# Main prefill: a dynamic extent up to MAX_EXTENT rows, walked in TILE-row tiles, with up
# to SLOTS_PER_RANK chunks per rank per launch; MTP prefill is MTP_WINDOW rows wide.
TILE = 128
MAX_EXTENT = 8192
SLOTS_PER_RANK = 4
MTP_WINDOW = 128
BLOCK_SIZE = 128

# Decode specializations by K (speculative tokens per step).
DECODE_LAYOUTS: dict[int, DecodeLayout] = {
    0: DecodeLayout(k=0, batch=8, seq=1, kernel="decode_b8s1"),
    1: DecodeLayout(k=1, batch=4, seq=2, kernel="decode_b4s2"),
    2: DecodeLayout(k=2, batch=4, seq=3, kernel="decode_b4s3"),
    3: DecodeLayout(k=3, batch=4, seq=4, kernel="decode_b4s4"),
}
DEFAULT_NUM_SPECULATIVE_TOKENS = 0
DECODE_MICRO_BATCHES = 2  # decode launches per rank per step, at most
REQUEST_SLOTS_PER_RANK = 16  # device-state slots: every running request of a rank

# Context lengths the compiled graphs are specialized for; the last is MAX_MODEL_LEN.
CONTEXT_BUCKETS = (1024, 4096, 16384)

# Limits in force unless the command line lowers them.
MAX_NUM_BATCHED_TOKENS = 8192
LONG_PREFILL_TOKEN_THRESHOLD = 8192
MAX_MODEL_LEN = 16384
MAX_NUM_SEQS = 32


def decode_layout(k: int) -> DecodeLayout:
    """The decode layout serving K speculative tokens."""
    if k not in DECODE_LAYOUTS:
        raise ValueError(f"spec specs/v41-tiny.yaml has no decode layout for K={k}; "
                         f"it serves K in {sorted(DECODE_LAYOUTS)}")
    return DECODE_LAYOUTS[k]


def effective_extent(max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
                     long_prefill_token_threshold: int = LONG_PREFILL_TOKEN_THRESHOLD,
                     max_model_len: int = MAX_MODEL_LEN) -> int:
    """Most prompt tokens one main-prefill chunk carries under these limits."""
    return min(MAX_EXTENT, max_num_batched_tokens, long_prefill_token_threshold, max_model_len)


def dispatch_extent(chunk_len: int) -> int:
    """Rows of the main-prefill launch for a chunk: its length padded to the next tile."""
    if not 0 < chunk_len <= MAX_EXTENT:
        raise ValueError(f"chunk of {chunk_len} tokens; one dispatch takes 1..{MAX_EXTENT}")
    return -(-chunk_len // TILE) * TILE


def context_bucket(length: int) -> int:
    """The smallest context bucket holding `length` positions."""
    for bucket in CONTEXT_BUCKETS:
        if length <= bucket:
            return bucket
    raise ValueError(f"a context of {length} positions exceeds the largest bucket "
                     f"{CONTEXT_BUCKETS[-1]} of spec specs/v41-tiny.yaml")
