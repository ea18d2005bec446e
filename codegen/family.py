"""The model families a spec may describe, and what codegen does with each.

A spec is DeepSeek V4.1 when its model section says `model_type: deepseek_v41_text`
(the release's text_config spelling), else DeepSeek V4 (whose config.json has no
model_type key in the spec). Both are validated, planned and given launch wrappers. A
V4.1 package launches less than its spec plans, and its contract says so: its kernels run
on the torch backend only (the compiled backend's graphs are V4's) and decode at K = 0
only (DSpark drafting is issue 58), whatever the spec's topology and decode sections ask.
A family with `launchable` False would get a package without kernels.py that says why.
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
    drafts: bool = True         # its decode kernels draft (K > 0); else K = 0 only
    backends: tuple[str, ...] = ()   # the backends its kernels run on; (): any

    def served_backend(self, asked: str) -> str:
        """The backend a package of this family names: the spec's when it can run the
        kernels, else the family's first."""
        return asked if not self.backends or asked in self.backends else self.backends[0]


V4 = Family("deepseek_v4", "DeepSeek V4", Spec, launchable=True)
V41 = Family("deepseek_v41", "DeepSeek V4.1", SpecV41, launchable=True, drafts=False,
             backends=("torch",))
FAMILIES = {f.name: f for f in (V4, V41)}

NOT_LAUNCHABLE = ("codegen validates and plans it (architecture, contract, pools), but its "
                  "launch wrappers are not generated: nothing runs the {title} forward")
# Why a family that does not draft serves K = 0 only, and why it names another backend.
NO_DRAFTS = ("{title}'s drafter is not launched yet (DSpark: issue 58): its decode kernels "
             "serve K = 0 only")
ONLY_BACKENDS = ("{title}'s kernels run on the {backends} backend only (the compiled "
                 "backend's graphs implement DeepSeek V4)")


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
