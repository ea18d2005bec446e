# @generated from specs/deepseek-v41-flash.yaml by codegen — do not edit
"""Planned package of spec `deepseek-v41-flash` (specs/deepseek-v41-flash.yaml), DeepSeek V4.1.

architecture   the model section (config.json keys), layer kinds and roles, fingerprint
contract       prefill/decode shapes, limits, topology, effective extent
pools          the pool groups: geometry, dtype, policy, blocks per request

No kernels: NO_KERNELS says why.
"""
from __future__ import annotations

from . import architecture, contract, pools

SPEC_NAME = "deepseek-v41-flash"
SPEC_PATH = "specs/deepseek-v41-flash.yaml"
# sha256 of the spec's text: the command refuses a spec edited since (server/cli/spec_check.py)
SPEC_SHA256 = "f2a83ed4b2a1b380a3b4f628fb35b8ca9f1854578dcb178a55967921d69f602f"
FAMILY = "deepseek_v41"
LAUNCHABLE = False   # no launch wrappers: nothing can serve this spec yet
NO_KERNELS = (
    "codegen validates and plans it (architecture, contract, pools), but its launch wrappers "
    "are not generated yet: the DeepSeek V4.1 forward runs on the torch path in tests "
    "(runtime/model/forward_v41.py), not through the engine (issue 57)"
)

__all__ = ["FAMILY", "LAUNCHABLE", "NO_KERNELS", "SPEC_NAME", "SPEC_PATH", "SPEC_SHA256",
           "architecture", "contract", "pools"]


def __getattr__(name: str):
    """`kernels` is not there, and says why."""
    if name == "kernels":
        raise AttributeError(f"spec {SPEC_NAME} has no kernels: {NO_KERNELS}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
