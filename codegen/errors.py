"""Spec errors that point into the YAML: file, line and field path."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpecIssue:
    """One problem in a spec, located at `line` of `path` (1-based)."""

    path: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}"
        field = f" {self.field}:" if self.field else ""
        return f"{where}:{field} {self.message}"


class SpecError(ValueError):
    """A spec failed to load or validate. One line per issue, sorted by line."""

    def __init__(self, issues: list[SpecIssue]):
        self.issues = sorted(issues, key=lambda i: (i.line, i.field, i.message))
        super().__init__("\n".join(str(i) for i in self.issues))
