# @generated from specs/tiny.yaml by codegen — do not edit
"""Generated serving package of spec `tiny` (specs/tiny.yaml).

architecture   the model section (config.json keys), layer kinds, weight fingerprint
contract       prefill/decode shapes, limits, topology, effective extent
pools          the pool groups: geometry, dtype, policy, blocks per request
kernels        the launch ABI of every kernel specialization
"""
from __future__ import annotations

from . import architecture, contract, kernels, pools

SPEC_NAME = "tiny"
SPEC_PATH = "specs/tiny.yaml"
# sha256 of the spec's text: the command refuses a spec edited since (server/cli/spec_check.py)
SPEC_SHA256 = "2320ce0d7e671631864a1e3aa39ee266bfe119e73a40bc7140997c3169936b7a"

__all__ = ["SPEC_NAME", "SPEC_PATH", "SPEC_SHA256", "architecture", "contract", "kernels", "pools"]
