"""The codegen pipeline: load -> check -> plan -> render -> write."""
from __future__ import annotations

import difflib
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic

from codegen.errors import SpecError, SpecIssue
from codegen.family import family_of_data
from codegen.invariants import check_invariants
from codegen.plan import Plan, build_plan
from codegen.render import environment, render_index, render_package
from codegen.schema import Spec
from codegen.writer import Drift, compare, write
from codegen.yaml_loader import FieldPath, Locator, load_yaml
from contract.spec_digest import spec_digest


def display_path(path: Path, root: Path | None = None) -> str:
    """`path` relative to `root` (default: the working directory) when it lies inside."""
    root = (root or Path.cwd()).resolve()
    try:
        return path.resolve().relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def load_spec(path: str | Path, root: Path | None = None) -> Spec:
    """Read, validate and check one spec file; SpecError names file, line and field."""
    path = Path(path)
    shown = display_path(path, root)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        issue = SpecIssue(shown, 1, "", f"cannot read the spec: {exc.strerror}")
        raise SpecError([issue]) from None
    data, locator = load_yaml(text, shown)
    schema = family_of_data(data).spec
    try:
        spec = schema.model_validate(data)
    except pydantic.ValidationError as exc:
        raise SpecError(_issues(locator, exc.errors(), schema)) from None
    problems = check_invariants(spec)
    if problems:
        raise SpecError([locator.issue(at, message) for at, message in problems])
    return spec


def plan_spec(path: str | Path, root: Path | None = None) -> Plan:
    path = Path(path)
    spec = load_spec(path, root)
    return build_plan(spec, display_path(path, root), path.stem, spec_digest(path))


@dataclass
class Result:
    plans: list[Plan]
    drift: Drift


def generate(spec_paths: list[Path], out_dir: Path, *, root: Path | None = None,
             every: bool = True, check: bool = False) -> Result:
    """Generate specs into `out_dir`. With `every` (the specs are all there are),
    `out_dir` is wholly owned by codegen: any file no spec generates is removed. Without,
    only these specs' packages are, and the index lists them beside the packages already
    there. With `check`, nothing is written and the drift is reported."""
    plans = [plan_spec(p, root) for p in sorted(spec_paths)]
    _reject_clashes(plans)
    env = environment()
    files: dict[str, str] = {}
    for plan in plans:
        files.update(render_package(plan, env))
    specs = {} if every else present_packages(out_dir)
    specs.update({plan.package: plan.spec_path for plan in plans})
    specs_dir = display_path(spec_paths[0].parent, root) if spec_paths else "specs"
    files.update(render_index(specs, specs_dir, env))
    owned = ["."] if every else ["__init__.py"] + [plan.package for plan in plans]
    drift = (compare if check else write)(files, out_dir, owned)
    return Result(plans, drift)


def present_packages(out_dir: Path) -> dict[str, str]:
    """Generated packages in `out_dir`: package -> the spec path it records."""
    found = {}
    for init in sorted(out_dir.glob("*/__init__.py")):
        match = re.search(r'^SPEC_PATH = "(.*)"$', init.read_text(encoding="utf-8"), re.M)
        if match:
            found[init.parent.name] = match.group(1)
    return found


def _reject_clashes(plans: list[Plan]) -> None:
    seen: dict[str, str] = {}
    for plan in plans:
        if plan.package in seen:
            raise SpecError([SpecIssue(plan.spec_path, 1, "", f"generates package {plan.package}, "
                                       f"as {seen[plan.package]} does; rename one file")])
        seen[plan.package] = plan.spec_path


def _issues(locator: Locator, errors: list[Any], schema: Any = Spec) -> list[SpecIssue]:
    """Pydantic errors as located issues. A misspelt key is one issue, not an unknown
    key plus a missing one: the missing key it resembles is named in its message."""
    missing = {tuple(e["loc"]) for e in errors if e["type"] == "missing"}
    issues = []
    for err in errors:
        at: FieldPath = tuple(err["loc"])
        if err["type"] == "extra_forbidden":
            issues.append(_unknown_key(locator, at, missing, schema))
    for err in errors:
        at = tuple(err["loc"])
        if err["type"] != "extra_forbidden" and (err["type"] != "missing" or at in missing):
            issues.append(_issue(locator, err))
    return issues


def _unknown_key(locator: Locator, at: FieldPath, missing: set[FieldPath],
                 schema: Any) -> SpecIssue:
    """An unknown key; if a missing sibling resembles it, claim that one (removed from
    `missing`) as the key that was meant."""
    siblings = [str(m[-1]) for m in missing if m[:-1] == at[:-1]]
    guess = difflib.get_close_matches(str(at[-1]), siblings, n=1)
    hint = ""
    if guess:
        missing.discard(at[:-1] + (guess[0],))
        hint = f" (did you mean {guess[0]!r}?)"
    valid = ", ".join(_valid_keys(at[:-1], schema))
    return locator.issue(at, f"unknown key {at[-1]!r}{hint}; valid keys here: {valid}")


def _issue(locator: Locator, err: Any) -> SpecIssue:
    """A pydantic error, located and worded for a person editing YAML."""
    at: FieldPath = tuple(err["loc"])
    if err["type"] == "missing":
        return locator.issue(at, "missing required key")
    message = err["msg"]
    if "input" in err and not isinstance(err["input"], (dict, list)):
        message += f", got {err['input']!r}"
    return locator.issue(at, message)


def _valid_keys(at: FieldPath, schema: Any) -> list[str]:
    """Field names of the spec model that sits at `at` (a dict's values are one model:
    the key after a dict field is a name, not a field)."""
    model: Any = schema
    named = False
    for part in at:
        if isinstance(part, int) or named:
            named = False
            continue
        annotation = model.model_fields[part].annotation
        args = getattr(annotation, "__args__", (annotation,))
        named = typing.get_origin(annotation) is dict
        model = args[-1] if named else args[0]
    return list(model.model_fields)
