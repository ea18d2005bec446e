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
SPEC_SHA256 = "802e37854d91eceb2d312059896c1204ed3e6cf2fefa27fa74e3e37b317d0c36"

__all__ = ["SPEC_NAME", "SPEC_PATH", "SPEC_SHA256", "architecture", "contract", "kernels", "pools"]
