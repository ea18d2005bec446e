"""Shared fixtures: the repository root and helpers to write specs and import packages."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SPECS = REPO / "specs"


@pytest.fixture
def tiny_text() -> str:
    return (SPECS / "tiny.yaml").read_text()


def replace_once(text: str, old: str, new: str) -> str:
    """`text` with the single occurrence of `old` replaced (fails loudly otherwise)."""
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times"
    return text.replace(old, new)


def line_of(text: str, needle: str) -> int:
    """1-based line of the single line containing `needle`."""
    hits = [i + 1 for i, line in enumerate(text.splitlines()) if needle in line]
    assert len(hits) == 1, f"{needle!r} is on lines {hits}"
    return hits[0]


def import_fresh(root: Path, package: str):
    """Import `package` from folder `root`, dropping any earlier import of that name."""
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    try:
        importlib.invalidate_caches()
        return importlib.import_module(package)
    finally:
        sys.path.remove(str(root))


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one thread for a module of tiny tensors (a second thread's wake-ups
    cost more than the work); restored after it."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
