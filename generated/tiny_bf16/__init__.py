# @generated from specs/tiny-bf16.yaml by codegen — do not edit
"""Generated serving package of spec `tiny-bf16` (specs/tiny-bf16.yaml).

architecture   the model section (config.json keys), layer kinds, weight fingerprint
contract       prefill/decode shapes, limits, topology, effective extent
pools          the pool groups: geometry, dtype, policy, blocks per request
kernels        the launch ABI of every kernel specialization
"""
from __future__ import annotations

from . import architecture, contract, kernels, pools

SPEC_NAME = "tiny-bf16"
SPEC_PATH = "specs/tiny-bf16.yaml"
# sha256 of the spec's text: the command refuses a spec edited since (server/cli/spec_check.py)
SPEC_SHA256 = "d2d1146f0cc7d8e8575638f3305dcd9a12bb9f87f685d926aed153781c61030e"

__all__ = ["SPEC_NAME", "SPEC_PATH", "SPEC_SHA256", "architecture", "contract", "kernels", "pools"]
