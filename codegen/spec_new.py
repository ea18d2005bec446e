"""`v4serve spec new`: a spec for a checkpoint that has none.

The architecture comes from the checkpoint's config.json, and what the weights beside it
are stored as (FP8 / FP4 or not, from their safetensors headers) sets `weights`; the
serving shapes, limits, topology and pool settings come from a base spec. Pool row
widths and layer sets are re-derived for the new architecture, so the result validates
whenever the base's serving choices suit the new model (for example ep must divide its
expert count).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pydantic
import yaml

from codegen.errors import SpecError
from codegen.pipeline import load_spec
from codegen.pool_roles import ROLES, layer_kinds, role_kinds
from codegen.schema import ModelSection, RopeScaling, Spec
from contract.checkpoint_layout import is_fp8_projection, is_routed_expert
from contract.safetensors_header import SafetensorsHeader

FLOW_KEYS = {"compress_ratios", "num_speculative_tokens"}


def spec_from_config(config: dict[str, Any], base: Spec) -> dict[str, Any]:
    """The new spec as plain data: config.json's model keys + the base's serving choices."""
    missing = [key for key in ModelSection.model_fields if key not in config]
    if missing:
        raise ValueError(f"config.json lacks {', '.join(missing)}")
    picked = {k: config[k] for k in ModelSection.model_fields}
    if isinstance(picked["rope_scaling"], dict):  # keep the YaRN keys V4 reads
        picked["rope_scaling"] = {k: v for k, v in picked["rope_scaling"].items()
                                  if k in RopeScaling.model_fields}
    try:
        model = ModelSection.model_validate(picked)
    except pydantic.ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"config.json: {problems}") from None
    data = base.model_dump(mode="json")
    data["model"] = model.model_dump(mode="json")
    kinds = layer_kinds(model)
    for role in ROLES:
        group = data["pools"]["groups"][role.name]
        group["layers"] = role_kinds(role, kinds)
        group["row_width"] = role.width(model)
    return data


def released_weights(directory: Path) -> dict[str, str] | None:
    """How the checkpoint beside a config.json stores its weights, from the safetensors
    headers alone: {"dense": fp8 | unquantized, "experts": fp4 | unquantized}; None
    when there are no weights there."""
    dtypes: dict[str, str] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for path in sorted(directory.glob("*.safetensors")):
        f = SafetensorsHeader(path)
        try:
            dtypes.update({name: f.dtype(name) for name in f.keys()})
            shapes.update({name: f.shape(name) for name in f.keys()})
        finally:
            f.close()
    if not dtypes:
        return None
    def held(name: str, stored: tuple[str, ...]) -> bool:
        scale = name.removesuffix(".weight") + ".scale"
        return dtypes[name] in stored and scale in dtypes

    # a format only if every weight of its kind has it: the loader holds a layer's experts
    # packed only when all are, and dequantizes the rest (planning them unquantized errs
    # toward more memory)
    weights = [(n, tuple(shapes[n])) for n in dtypes if n.endswith(".weight")]
    experts = [n for n, _ in weights if is_routed_expert(n)]
    dense = [n for n, shape in weights if is_fp8_projection(n, shape)]
    return {"dense": "fp8" if dense and all(held(n, ("F8_E4M3",)) for n in dense)
            else "unquantized",
            "experts": "fp4" if experts and all(held(n, ("I8", "U8")) for n in experts)
            else "unquantized"}


def render_spec(data: dict[str, Any], source: str, base: str) -> str:
    """YAML with one line per pool group and decode layout, like the hand-written specs."""
    lines = [f"# Written by `v4serve spec new` from {source} with the serving choices of {base}."]
    for section, values in data.items():
        lines.append(f"\n{section}:")
        lines += _render_mapping(values, section)
    return "\n".join(lines) + "\n"


def _render_mapping(values: dict[str, Any], section: str) -> list[str]:
    lines = []
    for key, value in values.items():
        if section == "pools" and key == "groups":
            lines.append("  groups:")
            lines += [f"    {name}: {_flow(group)}" for name, group in value.items()]
        elif section == "decode" and key == "layouts":
            lines.append("  layouts:")
            lines += [f"    - {_flow(layout)}" for layout in value]
        elif isinstance(value, dict) or (isinstance(value, list) and key not in FLOW_KEYS):
            dumped = yaml.safe_dump({key: value}, sort_keys=False, default_flow_style=False)
            lines += ["  " + line for line in dumped.rstrip().splitlines()]
        else:
            lines.append(f"  {key}: {_flow(value)}")
    return lines


def _flow(value: Any) -> str:
    """One-line YAML for a scalar, list or mapping (no document-end marker)."""
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10**6)
    return text.removesuffix("\n...\n").strip()


def run_new(args: argparse.Namespace) -> int:
    try:
        base = load_spec(args.base)
        config = json.loads(args.from_config.read_text())
        data = spec_from_config(config, base)
        released = released_weights(args.from_config.parent)
    except (SpecError, OSError, ValueError) as exc:
        print(f"spec new: {exc}", file=sys.stderr)
        return 1
    if released:                      # the weights section says what the checkpoint holds
        data["weights"] = {**data["weights"], **released}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(render_spec(data, args.from_config.as_posix(), args.base.as_posix()))
    try:
        load_spec(args.output)
    except SpecError as exc:
        print(f"spec new: wrote {args.output}, but it needs an edit before codegen:\n{exc}",
              file=sys.stderr)
        return 1
    print(f"spec new: wrote {args.output}; next: `v4serve codegen {args.output}`")
    return 0
