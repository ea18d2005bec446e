"""`--spec` resolved to its generated package, and refused when generated/ is older than
the spec: serving code generated from another text of the spec would run other shapes
than the file says, silently."""
from __future__ import annotations

from pathlib import Path
from types import ModuleType

import generated
from contract.model_args import ModelArgs
from contract.spec_digest import spec_digest

REPO = Path(generated.__file__).resolve().parent.parent


def default_model(spec: str) -> Path:
    """The checkpoint a spec serves by default: models/<spec> in the repository, or for
    a variant of another spec (tiny-bf16, tiny-fp8: the same checkpoint computed or
    cached otherwise) the checkpoint of the spec its name extends; models/<spec> when
    there is none (loading then says it is missing)."""
    name = spec.replace("_", "-")
    for cut in range(name.count("-") + 1):
        candidate = REPO / "models" / name.rsplit("-", cut)[0]
        if candidate.is_dir():
            return candidate
    return REPO / "models" / name


class StaleSpecError(ValueError):
    """The spec file and its generated package disagree; the message says the fix."""


def load_current(spec: str) -> ModuleType:
    """The generated package for `spec` (a name, or a spec file that must exist), checked
    against the spec file's text. A package whose spec file is absent (an installed copy
    without specs/) is served as generated."""
    given = _as_path(spec)
    if given is not None and not given.is_file():
        raise StaleSpecError(f"--spec {spec}: no such spec file")
    try:
        package = generated.load(spec)
    except KeyError as exc:
        raise StaleSpecError(exc.args[0]) from None
    path = given or REPO / package.SPEC_PATH
    if path.is_file() and spec_digest(path) != getattr(package, "SPEC_SHA256", None):
        raise StaleSpecError(_stale(path, package))
    return package


class CacheDtypeError(StaleSpecError):
    """--kv-cache-dtype asks for entry formats the spec does not declare."""


CACHE_DTYPES = ("auto", "fp8")


# The served formats a spec declares, per family, for --kv-cache-dtype fp8's message.
SERVED_FORMATS = {False: "fp8_ds for ori, cmp_c4, cmp_c128; fp8 or fp4 for idx",
                  True: "fp8_32 for ori, fp4_16 for cmp_c<r>, fp4_32 for idx_c<r>"}


def served(spec: str, cache_dtype: str = "auto") -> ModuleType:
    """The generated package serving `spec` with --kv-cache-dtype `cache_dtype` (vLLM's
    flag): "auto" the spec as it declares its pools; "fp8" its family's served formats
    (V4: fp8_ds main entries, FP8/FP4 indexer keys; V4.1: fp8_32 windows, fp4_16
    compressed KV, fp4_32 index keys): the spec itself when it stores its compressed KV
    so, else its `<name>-fp8` variant (specs/tiny-fp8.yaml)."""
    package = load_current(spec)
    if cache_dtype not in CACHE_DTYPES:
        raise CacheDtypeError(f"--kv-cache-dtype {cache_dtype!r}: one of "
                              f"{', '.join(CACHE_DTYPES)}")
    if cache_dtype == "auto" or _packs_compressed_kv(package):
        return package
    variant = f"{package.SPEC_NAME}-fp8"
    try:
        return load_current(variant)
    except StaleSpecError as exc:
        if variant.replace("-", "_") in generated.SPECS:
            raise
        raise CacheDtypeError(
            f"--kv-cache-dtype fp8: spec {package.SPEC_NAME} stores its cache entries as "
            f"computed and there is no {variant} spec; declare pools.groups.<group>.format "
            f"({SERVED_FORMATS[_is_v41(package)]}) in a spec") from exc


def _packs_compressed_kv(package: ModuleType) -> bool:
    """Whether every compressed-KV group (cmp_*: V4's cmp_c4 and cmp_c128, V4.1's
    cmp_c<r>) stores its entries in a served format rather than as computed."""
    groups = [g for name, g in package.pools.GROUPS.items() if name.startswith("cmp_")]
    return bool(groups) and all(g.format != "compute" for g in groups)


def _is_v41(package: ModuleType) -> bool:
    return ModelArgs.from_config(package.architecture.CONFIG).is_v41


def _as_path(spec: str) -> Path | None:
    return Path(spec) if spec.endswith((".yaml", ".yml")) or "/" in spec else None


def _stale(path: Path, package: ModuleType) -> str:
    """One line: the spec, what is wrong with it (when it no longer validates) and the fix."""
    from codegen.errors import SpecError
    from codegen.pipeline import load_spec

    folder = f"generated/{package.__name__.rsplit('.', 1)[-1]}/"
    try:
        load_spec(path)
    except SpecError as exc:
        first = str(exc).splitlines()[0]
        return f"spec {path} no longer matches {folder} and does not validate: {first}"
    fix = "make codegen" if path.resolve() == (REPO / package.SPEC_PATH).resolve() \
        else f"v4serve codegen {path}"
    return f"spec {path} has changed since {folder} was generated from it; run `{fix}`"
