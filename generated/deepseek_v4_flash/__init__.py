# @generated from specs/deepseek-v4-flash.yaml by codegen — do not edit
"""Generated serving package of spec `deepseek-v4-flash` (specs/deepseek-v4-flash.yaml).

architecture   the model section (config.json keys), layer kinds, weight fingerprint
contract       prefill/decode shapes, limits, topology, effective extent
pools          the pool groups: geometry, dtype, policy, blocks per request
kernels        the launch ABI of every kernel specialization
"""
from __future__ import annotations

from . import architecture, contract, kernels, pools

SPEC_NAME = "deepseek-v4-flash"
SPEC_PATH = "specs/deepseek-v4-flash.yaml"
# sha256 of the spec's text: the command refuses a spec edited since (server/cli/spec_check.py)
SPEC_SHA256 = "8fec9a02c8a2e36353d990b0ce5d68e622a5c76ea8fcb84da13e0e88f0bf295a"

__all__ = ["SPEC_NAME", "SPEC_PATH", "SPEC_SHA256", "architecture", "contract", "kernels", "pools"]
