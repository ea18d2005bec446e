"""Render a plan into generated source files (path -> text). Pure: no file I/O."""
from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

import jinja2

from codegen.abi import kernel_plans
from codegen.family import FAMILIES, NOT_LAUNCHABLE
from codegen.plan import Plan, PoolPlan
from contract.abi import MTP_SLOT_FIELDS, Arg, KernelABI

TEMPLATES = Path(__file__).parent / "templates"
WIDTH = 99  # the longest line the renderers below write


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


@dataclass(frozen=True)
class _Text:
    """A keyword's string value, broken at spaces where a line fills (implicit
    concatenation)."""

    keyword: str
    value: str


@dataclass(frozen=True)
class _Ints:
    """A keyword's tuple of ints, broken between items where a line fills."""

    keyword: str
    values: tuple[int, ...]


def _packed_call(func: str, items: list[str | _Text | _Ints], indent: int) -> str:
    """`func(items...),` with the items packed up to WIDTH, continuation lines indented
    by `indent` + 4."""
    return _pack(items, " " * indent + func + "(", " " * (indent + 4), "),")


def _pack(items: list[str | _Text | _Ints], first: str, inner: str, end: str) -> str:
    """The items comma-separated from `first` on, lines broken before WIDTH, then `end`."""
    lines, line = [], first
    for i, item in enumerate(items):
        tail = end if i == len(items) - 1 else ","
        if isinstance(item, _Text):
            line = _pack_text(item, line, inner, tail, lines)
            continue
        if isinstance(item, _Ints):
            line = _pack_ints(item, line, inner, tail, lines)
            continue
        if len(line) + len(item) + len(tail) > WIDTH and line.strip() \
                and not line.endswith("("):
            lines.append(line.rstrip())
            line = inner
        line += item + tail + " "
    lines.append(line.rstrip())
    return "\n".join(lines)


def _pack_text(text: _Text, line: str, inner: str, tail: str, lines: list[str]) -> str:
    """Append `keyword="..."` to `line`: on a new line when it fits there whole but not
    here, else broken between words at WIDTH; returns the open line."""
    words, whole = text.value.split(" "), len(text.keyword) + len(_py(text.value)) + 2
    if len(line) + whole + len(tail) > WIDTH and len(inner) + whole + len(tail) <= WIDTH \
            or len(line) + len(text.keyword) + len(words[0]) + 4 > WIDTH:
        lines.append(line.rstrip())
        line = inner
    line, chunk = line + text.keyword + "=", ""
    for word in words:
        piece = f"{chunk} {word}" if chunk else word
        if len(line) + len(_py(piece + " ")) + len(tail) > WIDTH and chunk:
            lines.append(line + _py(chunk + " "))
            line, piece = inner, word
        chunk = piece
    return line + _py(chunk) + tail + " "


def _pack_ints(ints: _Ints, line: str, inner: str, tail: str, lines: list[str]) -> str:
    """Append `keyword=(a, b, ...)` to `line`, breaking between items at WIDTH; returns
    the open line."""
    if len(ints.values) == 1:
        return line + f"{ints.keyword}=({ints.values[0]},){tail} "
    line += f"{ints.keyword}=("
    for i, value in enumerate(ints.values):
        text = str(value) + (f"){tail}" if i == len(ints.values) - 1 else ",")
        if len(line) + len(text) > WIDTH:
            lines.append(line.rstrip())
            line = inner
        line += text + " "
    return line


def _string_lines(text: str, width: int) -> list[str]:
    """`text` cut between words into pieces whose literals fit `width` (each piece but the
    last keeps its trailing space, so the pieces concatenate back to `text`)."""
    lines, line = [], ""
    for word in text.split(" "):
        piece = f"{line} {word}" if line else word
        if len(_py(piece + " ")) > width and line:
            lines.append(line + " ")
            piece = word
        line = piece
    return lines + [line]


def _bullets(notes: tuple[str, ...]) -> list[str]:
    """Comment lines: each note a bullet ("# - "), wrapped at WIDTH."""
    return [line for note in notes
            for line in textwrap.wrap(note, WIDTH, initial_indent="# - ",
                                      subsequent_indent="#   ")]


def _arg_call(arg: Arg) -> str:
    """One Arg(...) of a kernel's table, at the table's indent."""
    items: list = [_py(arg.name), _py(arg.role), _py(arg.dtype), _py(arg.shape), _py(arg.expr)]
    if arg.staged:
        items.append("staged=True")
    if arg.doc:
        items.append(_Text("doc", arg.doc))
    return _packed_call("Arg", items, 8)


def _kernel_head(kernel: KernelABI) -> str:
    """The fields of a KernelABI that codegen decides, as keyword lines."""
    items = [f"spec={_py(kernel.spec)}", f"name={_py(kernel.name)}",
             f"kind={_py(kernel.kind)}", f"rows={kernel.rows}", f"seq={kernel.seq}",
             f"k={kernel.k}", _Text("doc", kernel.doc)]
    return _pack(items, "    ", "    ", ",")


def _group_call(pool: PoolPlan) -> str:
    """One group's PoolGroup(...) entry of GROUPS, with its doc."""
    doc = pool.doc + (f"; {pool.ring_rule}" if pool.ring_rule else "")
    fields = [f"{name}={_py(getattr(pool, name))}" for name in
              ("rows_per_page", "row_width", "dtype", "policy", "tokens_per_row",
               "ring_pages", "table_width", "page_bytes", "block_bytes", "formula",
               "format", "rope_width", "entry_bytes")]
    return _packed_call(f"{_py(pool.name)}: PoolGroup",
                        [_py(pool.name), _Ints("layers", pool.layers), *fields,
                         _Text("doc", doc)], 4)


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )
    env.filters.update(py=_py, packed=_packed, arg_call=_arg_call,
                       kernel_head=_kernel_head, group_call=_group_call,
                       bullets=_bullets)
    return env


def render_package(plan: Plan, env: jinja2.Environment | None = None) -> dict[str, str]:
    """Files of one spec's package, keyed by path relative to the package's parent."""
    env = env or environment()
    root = plan.package
    family = FAMILIES[plan.family]
    no_kernels = NOT_LAUNCHABLE.format(title=family.title)
    files = {
        f"{root}/__init__.py": env.get_template("package_init.py.j2").render(
            plan=plan, family_title=family.title,
            no_kernels_lines=_string_lines(no_kernels, WIDTH - 6)),
        f"{root}/architecture.py": env.get_template("architecture.py.j2").render(plan=plan),
        f"{root}/contract.py": env.get_template("contract.py.j2").render(plan=plan),
        f"{root}/pools.py": env.get_template("pools.py.j2").render(
            plan=plan, mtp_slot_fields=MTP_SLOT_FIELDS),
    }
    if plan.launchable:     # a family whose forward is not written gets no launch wrappers
        files[f"{root}/kernels.py"] = env.get_template("kernels.py.j2").render(
            plan=plan, kernels=kernel_plans(plan))
    return files


def render_index(specs: dict[str, str], specs_dir: str,
                 env: jinja2.Environment | None = None) -> dict[str, str]:
    """generated/__init__.py: the index of every generated package (package -> the
    spec file it came from)."""
    env = env or environment()
    text = env.get_template("root_init.py.j2").render(specs=dict(sorted(specs.items())),
                                                       specs_dir=specs_dir)
    return {"__init__.py": text}
