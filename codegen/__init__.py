"""v4serve code generator: specs/*.yaml -> generated/<spec>/.

Stages, each in its own module:
    load (yaml_loader, schema)  ->  check (invariants)  ->  plan (plan)
    ->  render (render, templates/)  ->  write (writer)
"""
from __future__ import annotations

from codegen.errors import SpecError
from codegen.pipeline import generate, load_spec

__all__ = ["SpecError", "generate", "load_spec"]
