# @generated from specs/*.yaml by codegen — do not edit
"""Generated serving packages, one per spec; `make codegen` rewrites this folder."""
from __future__ import annotations

import importlib
from types import ModuleType

# Package name -> the spec it was generated from.
SPECS = {
    "deepseek_v41_flash": "specs/deepseek-v41-flash.yaml",
    "deepseek_v4_flash": "specs/deepseek-v4-flash.yaml",
    "deepseek_v4_pro": "specs/deepseek-v4-pro.yaml",
    "reference": "specs/reference.yaml",
    "tiny": "specs/tiny.yaml",
    "tiny_bf16": "specs/tiny-bf16.yaml",
    "tiny_deep": "specs/tiny-deep.yaml",
    "tiny_fp8": "specs/tiny-fp8.yaml",
    "v41_tiny": "specs/v41-tiny.yaml",
}


def load(name: str) -> ModuleType:
    """Import the generated package of a spec, by name ("tiny", "deepseek-v4-flash") or by
    its file ("specs/tiny.yaml")."""
    if name.endswith((".yaml", ".yml")):
        name = name.replace("\\", "/").rsplit("/", 1)[-1].rsplit(".", 1)[0]
    package = name.replace("-", "_")
    if package not in SPECS:
        raise KeyError(f"no generated package for spec {name!r}; have {sorted(SPECS)}; "
                       "run `make codegen` after adding specs/<name>.yaml")
    return importlib.import_module(f"{__name__}.{package}")
