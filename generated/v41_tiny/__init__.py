# @generated from specs/v41-tiny.yaml by codegen — do not edit
"""Planned package of spec `v41-tiny` (specs/v41-tiny.yaml), DeepSeek V4.1.

architecture   the model section (config.json keys), layer kinds and roles, fingerprint
contract       prefill/decode shapes, limits, topology, effective extent
pools          the pool groups: geometry, dtype, policy, blocks per request

No kernels: NO_KERNELS says why.
"""
from __future__ import annotations

from . import architecture, contract, pools

SPEC_NAME = "v41-tiny"
SPEC_PATH = "specs/v41-tiny.yaml"
# sha256 of the spec's text: the command refuses a spec edited since (server/cli/spec_check.py)
SPEC_SHA256 = "c2dbd64d5dba8584d8707bc9710ea47bd9c3faf78dc26bb223143711882212b7"
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
