# @generated from specs/tiny-deep.yaml by codegen — do not edit
"""Generated serving package of spec `tiny-deep` (specs/tiny-deep.yaml).

architecture   the model section (config.json keys), layer kinds, weight fingerprint
contract       prefill/decode shapes, limits, topology, effective extent
pools          the pool groups: geometry, dtype, policy, blocks per request
kernels        the launch ABI of every kernel specialization
"""
from __future__ import annotations

from . import architecture, contract, kernels, pools

SPEC_NAME = "tiny-deep"
SPEC_PATH = "specs/tiny-deep.yaml"
# sha256 of the spec's text: the command refuses a spec edited since (server/cli/spec_check.py)
SPEC_SHA256 = "4325b20c3edf70d3389489c0496e797c6f9287a70e9ba5466de186673be989f7"

__all__ = ["SPEC_NAME", "SPEC_PATH", "SPEC_SHA256", "architecture", "contract", "kernels", "pools"]
