"""Render a plan into generated source files (path -> text). Pure: no file I/O."""
from __future__ import annotations

import json
from pathlib import Path

import jinja2

from codegen.abi import MTP_SLOT_FIELDS, ArgPlan, KernelPlan, kernel_plans
from codegen.plan import Plan

TEMPLATES = Path(__file__).parent / "templates"
WIDTH = 99  # the longest line a template renders through `call` or `packed`


def _py(value: object) -> str:
    """A Python literal with double-quoted strings; lists render as tuples."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        items = ", ".join(_py(v) for v in value)
        return f"({items},)" if len(value) == 1 else f"({items})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_py(k)}: {_py(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _call(items: list[str], func: str, indent: int = 0, suffix: str = "") -> str:
    """`func(items...)` at `indent`: on one line if it fits, else its items on one
    indented line, else one item per line (black's layout)."""
    pad, inner = " " * indent, " " * (indent + 4)
    one = f"{pad}{func}({', '.join(items)}){suffix}"
    if len(one) <= WIDTH:
        return one
    flat = f"{inner}{', '.join(items)},"
    if len(flat) <= WIDTH:
        return f"{pad}{func}(\n{flat}\n{pad}){suffix}"
    return f"{pad}{func}(\n" + "".join(f"{inner}{item},\n" for item in items) + f"{pad}){suffix}"


def _import(names: list[str], module: str) -> str:
    """`from module import names`, parenthesized one per line when too long."""
    line = f"from {module} import {', '.join(names)}"
    if len(line) <= WIDTH:
        return line
    return f"from {module} import (\n" + "".join(f"    {n},\n" for n in names) + ")"


def _packed(value: object, indent: int) -> str:
    """A literal whose long tuples wrap, items packed up to WIDTH, continuation lines
    indented by `indent` + 4."""
    text = _py(value)
    if indent + len(text) <= WIDTH or not isinstance(value, (list, tuple, dict)):
        return text
    inner = " " * (indent + 4)
    if isinstance(value, dict):
        body = "".join(f"{inner}{_py(k)}: {_py(v)},\n" for k, v in value.items())
        return "{\n" + body + " " * indent + "}"
    lines, line = [], inner
    for item in (_py(v) + "," for v in value):
        if len(line) + len(item) + 1 > WIDTH:
            lines.append(line.rstrip())
            line = inner
        line += item + " "
    lines.append(line.rstrip())
    return "(\n" + "\n".join(lines) + "\n" + " " * indent + ")"


def _torch_dtype(name: str | None) -> str:
    return "None" if name is None else f"torch.{name}"


def _arg_shape(shape: tuple) -> str:
    return _py(tuple(None if isinstance(d, str) else d for d in shape))


_BUF_DIMS = {"extent": "MAX_EXTENT", "ranks": "self.ranks"}


def _buf_shape(shape: tuple) -> str:
    return _py(tuple(_BUF_DIMS.get(d, d) for d in shape)).replace('"', "")


def _source(arg: ArgPlan) -> str:
    """Where marshal() takes a passed-through tensor from: its keyword, or a pool field."""
    if arg.name.startswith("pool_"):
        return "pools." + arg.name.removeprefix("pool_")
    return {"mtp_slots": "mtp.slots", "mtp_slot_hidden": "mtp.hidden"}.get(arg.name, arg.name)


def _arg_type(arg: ArgPlan) -> str:
    return {"weight": "object", "scalar": "int"}.get(arg.role, "torch.Tensor")


def _helpers(kernel: KernelPlan) -> list[str]:
    """The runtime.device.abi check/stage helpers a kernel's marshal() calls."""
    used = {"check_weights"}
    for arg in kernel.args:
        if arg.staged:
            used.add("stage")
        elif arg.role in ("input", "pool"):
            used.add("check_tensor")
    if kernel.dynamic_extent:
        used.add("check_extent")
    return sorted(used)


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )
    env.filters.update(py=_py, torch_dtype=_torch_dtype, arg_shape=_arg_shape,
                       buf_shape=_buf_shape, source=_source, arg_type=_arg_type, call=_call,
                       imports=_import, packed=_packed)
    return env


def render_package(plan: Plan, env: jinja2.Environment | None = None) -> dict[str, str]:
    """Files of one spec's package, keyed by path relative to the package's parent."""
    env = env or environment()
    root = plan.package
    kernels = kernel_plans(plan)
    files = {
        f"{root}/__init__.py": env.get_template("package_init.py.j2").render(plan=plan),
        f"{root}/architecture.py": env.get_template("architecture.py.j2").render(plan=plan),
        f"{root}/contract.py": env.get_template("contract.py.j2").render(plan=plan),
        f"{root}/pools.py": env.get_template("pools.py.j2").render(
            plan=plan, mtp_slot_fields=MTP_SLOT_FIELDS),
        f"{root}/kernels/__init__.py": env.get_template("kernels_init.py.j2").render(
            plan=plan, kernels=kernels),
    }
    kernel_template = env.get_template("kernel.py.j2")
    for kernel in kernels:
        files[f"{root}/kernels/{kernel.name}.py"] = kernel_template.render(
            plan=plan, k=kernel, helpers=_helpers(kernel))
    return files


def render_index(specs: dict[str, str], specs_dir: str,
                 env: jinja2.Environment | None = None) -> dict[str, str]:
    """generated/__init__.py: the index of every generated package (package -> the
    spec file it came from)."""
    env = env or environment()
    text = env.get_template("root_init.py.j2").render(specs=dict(sorted(specs.items())),
                                                       specs_dir=specs_dir)
    return {"__init__.py": text}
