# @generated from specs/deepseek-v4-pro.yaml by codegen — do not edit
"""Generated serving package of spec `deepseek-v4-pro` (specs/deepseek-v4-pro.yaml).

architecture   the model section (config.json keys), layer kinds, weight fingerprint
contract       prefill/decode shapes, limits, topology, effective extent
pools          the pool groups: geometry, dtype, policy, blocks per request
kernels        the launch ABI of every kernel specialization
"""
from __future__ import annotations

from . import architecture, contract, kernels, pools

SPEC_NAME = "deepseek-v4-pro"
SPEC_PATH = "specs/deepseek-v4-pro.yaml"
# sha256 of the spec's text: the command refuses a spec edited since (server/cli/spec_check.py)
SPEC_SHA256 = "aff6330e496a0b1e7b56bdab163c669b6fe276cdce785933fea5684ac8cef248"

__all__ = ["SPEC_NAME", "SPEC_PATH", "SPEC_SHA256", "architecture", "contract", "kernels", "pools"]
