"""`v4serve spec new`: a spec for a checkpoint that has none.

The architecture comes from the checkpoint's config.json, and what the weights beside it
are stored as (FP8 / FP4 or not, from their safetensors headers) sets `weights`; the
serving shapes, limits, topology and pool settings come from a base spec. Pool row
widths and layer sets are re-derived for the new architecture, so the result validates
whenever the base's serving choices suit the new model (for example ep must divide its
expert count).

A DeepSeek V4.1 checkpoint is recognized in either of its spellings: the release's
config.json (text_config) or inference/config.json (ModelArgs keys; bos/eos then come
from the tokenizer beside it, the weights from the checkpoint folder above). Its pool
groups follow its kv sources (codegen/pool_roles.py), in the base's cache dtype, and in
V4.1's served formats where the base quantizes the same kind of row.
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
from codegen.pool_roles import ROLES, layer_kinds, layer_labels, role_kinds, v41_roles
from codegen.schema import ModelSection, RopeScaling
from codegen.schema_v41 import ModelSectionV41, RopeScalingV41
from contract.checkpoint_layout import (
    is_engram_table,
    is_fp8_projection,
    is_routed_expert,
    is_v41_fp8_projection,
)
from contract.safetensors_header import SafetensorsHeader
from contract.v41_config import is_inference_spelling, is_v41, text_config

FLOW_KEYS = {"compress_ratios", "num_speculative_tokens", "kv_source_layer_ids",
             "index_source_layer_ids", "engram_layer_ids", "engram_num_embeddings",
             "dspark_target_layer_ids"}


def spec_from_config(config: dict[str, Any], base: Any,
                     tokens: dict[str, int] | None = None) -> dict[str, Any]:
    """The new spec as plain data: config.json's model keys + the base's serving choices
    (`tokens`: bos/eos ids for a config that lacks them, V4.1's inference spelling)."""
    if is_v41(config):
        return _v41_spec({**(tokens or {}), **text_config(config)}, base)
    if base.model.FAMILY != "deepseek_v4":
        raise ValueError("config.json is DeepSeek V4's and the base spec is not: its pool "
                         "groups cannot serve V4; take a V4 spec as --base (specs/tiny.yaml)")
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


def _v41_spec(text: dict[str, Any], base: Any) -> dict[str, Any]:
    """A V4.1 spec from the flat text_config spelling and a base of either family."""
    missing = [key for key in ModelSectionV41.model_fields if key not in text]
    if missing:
        raise ValueError(f"config.json lacks {', '.join(missing)}")
    picked = {k: text[k] for k in ModelSectionV41.model_fields}
    if isinstance(picked["rope_scaling"], dict):
        picked["rope_scaling"] = {k: v for k, v in picked["rope_scaling"].items()
                                  if k in RopeScalingV41.model_fields}
    try:
        model = ModelSectionV41.model_validate(picked)
    except pydantic.ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"config.json: {problems}") from None
    data = base.model_dump(mode="json")
    data["model"] = model.model_dump(mode="json")
    data["pools"] = {"block_size": base.pools.block_size, "groups": v41_groups(model, base)}
    return data


def v41_groups(model: ModelSectionV41, base: Any) -> dict[str, dict[str, Any]]:
    """The V4.1 model's pool groups: the base's cache dtype; a window, compressed-entry or
    index-key group in V4.1's served format where the base stores that kind of row
    packed; a full group's page one block of tokens, a state group's page its span."""
    ori = base.pools.group("ori")
    declared = base.pools.model_dump(mode="json")["groups"]     # either family's groups
    packed = {kind: any(g["format"] != "compute" for name, g in declared.items()
                        if name.split("_")[0] == kind) for kind in ("ori", "cmp", "idx")}
    labels, ratios = layer_labels(model), model.compress_ratios
    groups = {}
    for role in v41_roles(model):
        if role.is_state:
            rows = role.span
        else:
            rows = base.pools.block_size // role.ratio if role.policy == "full" \
                else ori.rows_per_page
        served = packed.get(role.name.split("_")[0], False) and len(role.formats) > 1
        groups[role.name] = {
            "layers": role_kinds(role, labels, ratios), "rows_per_page": rows,
            "row_width": role.width(model), "dtype": "float32" if role.is_state else ori.dtype,
            "policy": role.policy, "format": role.formats[1] if served else "compute"}
    return groups


def token_ids(directory: Path) -> dict[str, int]:
    """bos/eos ids from the tokenizer in `directory` or the folder above (V4.1's
    inference/config.json has none): tokenizer_config.json names the tokens,
    tokenizer.json gives their ids. {} when neither folder has both files."""
    for folder in (directory, directory.parent):
        names, vocab = folder / "tokenizer_config.json", folder / "tokenizer.json"
        if names.is_file() and vocab.is_file():
            return _ids_of(json.loads(names.read_text()), json.loads(vocab.read_text()))
    return {}


def _ids_of(names: dict[str, Any], tokenizer: dict[str, Any]) -> dict[str, int]:
    ids = dict(tokenizer.get("model", {}).get("vocab", {}))
    ids.update({t["content"]: t["id"] for t in tokenizer.get("added_tokens", [])})
    out = {}
    for key in ("bos", "eos"):
        token = names.get(f"{key}_token")
        token = token.get("content") if isinstance(token, dict) else token
        if token in ids:
            out[f"{key}_token_id"] = ids[token]
    return out


def weights_folder(config_path: Path, config: dict[str, Any]) -> Path:
    """Where a config's weights are: beside it, or, for V4.1's inference/config.json,
    in the checkpoint folder above."""
    folder = config_path.parent
    if is_inference_spelling(config) and not any(folder.glob("*.safetensors")):
        return folder.parent
    return folder


def released_weights(directory: Path, v41: bool = False) -> dict[str, str] | None:
    """How the checkpoint beside a config.json stores its weights, from the safetensors
    headers alone: {"dense": fp8 | unquantized, "experts": fp4 | unquantized} and, for
    V4.1, {"engram": fp8 | unquantized}; None when there are no weights there."""
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
    dense = [n for n, shape in weights
             if (is_v41_fp8_projection(n) if v41 else is_fp8_projection(n, shape))]
    out = {"dense": "fp8" if dense and all(held(n, ("F8_E4M3",)) for n in dense)
           else "unquantized",
           "experts": "fp4" if experts and all(held(n, ("I8", "U8")) for n in experts)
           else "unquantized"}
    if v41:
        tables = [n for n, _ in weights if is_engram_table(n)]
        out["engram"] = "fp8" if tables and all(held(n, ("F8_E4M3",)) for n in tables) \
            else "unquantized"
    return out


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
        v41 = is_v41(config)
        tokens = token_ids(args.from_config.parent) if v41 else None
        data = spec_from_config(config, base, tokens)
        released = released_weights(weights_folder(args.from_config, config), v41)
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
