# @generated from specs/reference.yaml by codegen — do not edit
"""Launch wrappers of spec `reference`, one per kernel specialization."""
from __future__ import annotations

from .prefill_main import PrefillMain
from .prefill_mtp import PrefillMtp
from .decode_b8s1 import DecodeB8S1
from .decode_b4s2 import DecodeB4S2

WRAPPERS = {
    "prefill_main": PrefillMain,
    "prefill_mtp": PrefillMtp,
    "decode_b8s1": DecodeB8S1,
    "decode_b4s2": DecodeB4S2,
}

# The decode wrapper serving each K (speculative tokens per step).
DECODE_BY_K = {
    0: DecodeB8S1,
    1: DecodeB4S2,
}

__all__ = ["PrefillMain", "PrefillMtp", "DecodeB8S1", "DecodeB4S2", "DECODE_BY_K", "WRAPPERS"]
