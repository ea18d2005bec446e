# @generated from specs/deepseek-v41-flash.yaml by codegen — do not edit
"""Generated serving package of spec `deepseek-v41-flash` (specs/deepseek-v41-flash.yaml).

architecture   the model section (config.json keys), layer kinds, weight fingerprint
contract       prefill/decode shapes, limits, topology, effective extent
pools          the pool groups: geometry, dtype, policy, blocks per request
kernels        the launch ABI of every kernel specialization
"""
from __future__ import annotations

from . import architecture, contract, kernels, pools

SPEC_NAME = "deepseek-v41-flash"
SPEC_PATH = "specs/deepseek-v41-flash.yaml"
# sha256 of the spec's text: the command refuses a spec edited since (server/cli/spec_check.py)
SPEC_SHA256 = "f2a83ed4b2a1b380a3b4f628fb35b8ca9f1854578dcb178a55967921d69f602f"
FAMILY = "deepseek_v41"
# `v4serve rehearse` runs the compiled backend's graphs; DeepSeek V4.1's kernels run
# on contract.BACKEND only: nothing has rehearsed this package's workspace
REHEARSED = False

__all__ = ["FAMILY", "REHEARSED", "SPEC_NAME", "SPEC_PATH", "SPEC_SHA256", "architecture",
           "contract", "kernels", "pools"]
