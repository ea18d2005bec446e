# @generated from specs/reference.yaml by codegen — do not edit
"""Generated serving package of spec `reference` (specs/reference.yaml).

architecture   the model section (config.json keys), layer kinds, weight fingerprint
contract       prefill/decode shapes, limits, topology, effective extent
pools          the pool groups: geometry, dtype, policy, blocks per request
kernels        the launch ABI of every kernel specialization
"""
from __future__ import annotations

from . import architecture, contract, kernels, pools

SPEC_NAME = "reference"
SPEC_PATH = "specs/reference.yaml"
# sha256 of the spec's text: the command refuses a spec edited since (server/cli/spec_check.py)
SPEC_SHA256 = "d52d99acfe4cc2998fff6fe93235fc2aefdf35b865b9c71d91ade68dcf7db8ac"

__all__ = ["SPEC_NAME", "SPEC_PATH", "SPEC_SHA256", "architecture", "contract", "kernels", "pools"]
