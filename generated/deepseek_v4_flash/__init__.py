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
SPEC_SHA256 = "c4919d2ac515a15992fed0c07ecf468bd05b9403a4846fd4ffd055b3d66f2479"

__all__ = ["SPEC_NAME", "SPEC_PATH", "SPEC_SHA256", "architecture", "contract", "kernels", "pools"]
