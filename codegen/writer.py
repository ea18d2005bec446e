"""Write rendered files: only what changed, stale files removed, or just report drift."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


def _paths() -> list[str]:
    return field(default_factory=list)


@dataclass
class Drift:
    """How a directory differs from what codegen would write there: paths relative to it."""

    missing: list[str] = _paths()
    changed: list[str] = _paths()
    extra: list[str] = _paths()
    unchanged: list[str] = _paths()

    @property
    def clean(self) -> bool:
        return not (self.missing or self.changed or self.extra)

    def lines(self, labels: tuple[str, str, str] = ("missing", "changed", "extra")) -> list[str]:
        """One line per differing file; the labels name missing, changed and extra files
        (a check says "missing"; once written, the same file is "new")."""
        groups = zip(labels, (self.missing, self.changed, self.extra))
        return [f"{label:<8} {p}" for label, paths in groups for p in paths]


def compare(files: dict[str, str], out_dir: Path, owned: list[str]) -> Drift:
    """Compare `files` (relative paths) with `out_dir`; files under `owned` roots that
    codegen would not write count as extra."""
    drift = Drift()
    for rel, text in sorted(files.items()):
        path = out_dir / rel
        if not path.exists():
            drift.missing.append(rel)
        elif path.read_bytes() != text.encode():
            drift.changed.append(rel)
        else:
            drift.unchanged.append(rel)
    drift.extra = sorted(set(_owned_files(out_dir, owned)) - set(files))
    return drift


def write(files: dict[str, str], out_dir: Path, owned: list[str]) -> Drift:
    """Make `out_dir` match `files`: write missing and changed, delete extra."""
    drift = compare(files, out_dir, owned)
    for rel in drift.missing + drift.changed:
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[rel].encode())
    for rel in drift.extra:
        (out_dir / rel).unlink()
    _prune_empty_dirs(out_dir, owned)
    return drift


def _owned_files(out_dir: Path, owned: list[str]) -> list[str]:
    found = []
    for root in owned:
        base = out_dir / root
        candidates = [base] if base.is_file() else base.rglob("*") if base.is_dir() else []
        for path in candidates:
            if path.is_file() and "__pycache__" not in path.parts:
                found.append(path.relative_to(out_dir).as_posix())
    return found


def _prune_empty_dirs(out_dir: Path, owned: list[str]) -> None:
    for root in owned:
        base = out_dir / root
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if path.is_dir() and not any(p for p in path.iterdir() if p.name != "__pycache__"):
                _remove_tree(path)


def _remove_tree(path: Path) -> None:
    for child in path.rglob("*"):
        if child.is_file():
            child.unlink()
    for child in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        child.rmdir()
    path.rmdir()
