"""The model families a spec may describe, and what codegen does with each.

A spec is DeepSeek V4.1 when its model section says `model_type: deepseek_v41_text`
(the release's text_config spelling), else DeepSeek V4 (whose config.json has no
model_type key in the spec). Both are validated and planned; only V4 gets launch wrappers
so far: the V4.1 forward (issue 57, deliverable 2) is not written, and a generated V4.1
package says so instead of carrying kernels that could not run.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from codegen.schema import Spec
from codegen.schema_v41 import SpecV41
from contract.v41_config import RELEASE_MODEL_TYPE


@dataclass(frozen=True)
class Family:
    name: str                   # ModelArgs.family
    title: str
    spec: type[BaseModel]       # the pydantic model of a whole spec
    launchable: bool            # codegen writes kernels.py (the launch ABI)


V4 = Family("deepseek_v4", "DeepSeek V4", Spec, launchable=True)
V41 = Family("deepseek_v41", "DeepSeek V4.1", SpecV41, launchable=False)
FAMILIES = {f.name: f for f in (V4, V41)}

NOT_LAUNCHABLE = ("codegen validates and plans it (architecture, contract, pools), but its "
                  "launch wrappers are not generated yet: the {title} forward runs on the "
                  "torch path in tests (runtime/model/forward_v41.py), not through the "
                  "engine (issue 57)")


def family_of_data(data: Any) -> Family:
    """The family a spec's raw data (as loaded from YAML) declares."""
    model = data.get("model") if isinstance(data, Mapping) else None
    model_type = model.get("model_type") if isinstance(model, Mapping) else None
    if isinstance(model_type, str) and model_type.startswith(RELEASE_MODEL_TYPE):
        return V41
    return V4


def family_of(spec: BaseModel) -> Family:
    """The family of a validated spec."""
    return FAMILIES[spec.model.FAMILY]
