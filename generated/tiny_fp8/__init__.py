# @generated from specs/tiny-fp8.yaml by codegen — do not edit
"""Generated serving package of spec `tiny-fp8` (specs/tiny-fp8.yaml).

architecture   the model section (config.json keys), layer kinds, weight fingerprint
contract       prefill/decode shapes, limits, topology, effective extent
pools          the pool groups: geometry, dtype, policy, blocks per request
kernels        the launch ABI of every kernel specialization
"""
from __future__ import annotations

from . import architecture, contract, kernels, pools

SPEC_NAME = "tiny-fp8"
SPEC_PATH = "specs/tiny-fp8.yaml"
# sha256 of the spec's text: the command refuses a spec edited since (server/cli/spec_check.py)
SPEC_SHA256 = "c4cec006389cc3f9b6a293f04f5c8fd0f222586e9c8be3a1325f304f79a8a431"

__all__ = ["SPEC_NAME", "SPEC_PATH", "SPEC_SHA256", "architecture", "contract", "kernels", "pools"]
