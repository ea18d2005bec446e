"""YAML loading that keeps the line of every key and rejects duplicate keys.

The result is plain Python data plus a `Locator` that maps a field path such as
("pools", "groups", "ori", "row_width") to the line it was written on.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from codegen.errors import SpecError, SpecIssue

FieldPath = tuple[str | int, ...]


def dotted(path: FieldPath) -> str:
    """("decode", "layouts", 1, "k") -> "decode.layouts[1].k"."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@dataclass
class Locator:
    """Line numbers (1-based) of every mapping key and sequence item of one file."""

    path: str
    lines: dict[FieldPath, int] = field(default_factory=dict)

    def line_of(self, path: FieldPath) -> int:
        """Line of `path`, or of its nearest written ancestor (a missing key's parent)."""
        for n in range(len(path), -1, -1):
            if path[:n] in self.lines:
                return self.lines[path[:n]]
        return 1

    def issue(self, path: FieldPath, message: str) -> SpecIssue:
        return SpecIssue(self.path, self.line_of(path), dotted(path), message)


def load_yaml(text: str, path: str) -> tuple[Any, Locator]:
    """Parse one YAML document; raise SpecError on syntax errors and duplicate keys."""
    locator = Locator(path)
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise SpecError([SpecIssue(path, 1, "", "the spec is empty")])
        return _build(loader, node, (), locator), locator
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise SpecError([SpecIssue(path, line, "", f"invalid YAML: {exc.problem}")]) from None
    finally:
        loader.dispose()


def _build(loader: yaml.SafeLoader, node: yaml.Node, at: FieldPath, loc: Locator) -> Any:
    loc.lines.setdefault(at, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        return _build_mapping(loader, node, at, loc)
    if isinstance(node, yaml.SequenceNode):
        return [_build(loader, item, at + (i,), loc) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def _build_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, at: FieldPath,
                   loc: Locator) -> dict:
    out: dict = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if not isinstance(key, (str, int)) or isinstance(key, bool):
            issue = SpecIssue(loc.path, line, dotted(at), f"key {key!r} must be a string")
            raise SpecError([issue])
        if key in out:
            first = loc.lines[at + (key,)]
            raise SpecError([SpecIssue(loc.path, line, dotted(at + (key,)),
                                       f"duplicate key (first written on line {first})")])
        loc.lines[at + (key,)] = line
        out[key] = _build(loader, value_node, at + (key,), loc)
    return out
