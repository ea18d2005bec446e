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
SPEC_SHA256 = "2c1a14217d6534906892125fa541bfcf1e07bb1ac74418b090c45e9db5b0552c"

__all__ = ["SPEC_NAME", "SPEC_PATH", "SPEC_SHA256", "architecture", "contract", "kernels", "pools"]
