# @generated from specs/v41-tiny.yaml by codegen — do not edit
"""Generated serving package of spec `v41-tiny` (specs/v41-tiny.yaml).

architecture   the model section (config.json keys), layer kinds, weight fingerprint
contract       prefill/decode shapes, limits, topology, effective extent
pools          the pool groups: geometry, dtype, policy, blocks per request
kernels        the launch ABI of every kernel specialization
"""
from __future__ import annotations

from . import architecture, contract, kernels, pools

SPEC_NAME = "v41-tiny"
SPEC_PATH = "specs/v41-tiny.yaml"
# sha256 of the spec's text: the command refuses a spec edited since (server/cli/spec_check.py)
SPEC_SHA256 = "1e3636bb37592377220e9e3f3c542534682fe0a2e37e064d4a86d34a4c75726c"
FAMILY = "deepseek_v41"
# `v4serve rehearse` runs the compiled backend's graphs; DeepSeek V4.1's kernels run
# on contract.BACKEND only: nothing has rehearsed this package's workspace
REHEARSED = False

__all__ = ["FAMILY", "REHEARSED", "SPEC_NAME", "SPEC_PATH", "SPEC_SHA256", "architecture",
           "contract", "kernels", "pools"]
