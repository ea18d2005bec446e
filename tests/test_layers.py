"""The import graph is the architecture the README draws: data flows one way,
contract <- codegen, contract <- generated <- runtime <- server, and nothing imports
upward or in a circle. Every import counts, the ones inside functions included: a lazy
import is still a dependency."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGES = ("contract", "codegen", "generated", "runtime", "server")

# package -> the packages it may import. The v4serve command (server/cli/) is the one
# place that sees codegen: it registers codegen's subcommands and explains a stale spec.
ALLOWED = {
    "contract": set(),
    "codegen": {"contract"},
    "generated": {"contract"},
    "runtime": {"contract", "generated"},
    "server": {"contract", "generated", "runtime"},
}
COMMAND = "server.cli"
COMMAND_ALLOWED = ALLOWED["server"] | {"codegen"}

# runtime's parts, bottom first: a part imports only the parts before it. Text
# (tokenizer, detokenizer, grammar) and the core (configuration, requests, scheduler,
# pools, prefix cache) are torch-free bookkeeping; planning sizes a deployment; model is
# the math and weights load it; sampling draws tokens from logits; backends run kernels;
# device launches them and runs a step's launches; executor runs steps on the ranks (in
# this process or in rank workers); engine serves requests; process is the plumbing of
# the engine-core process.
RUNTIME_PARTS = ("text", "core", "planning", "model", "weights", "sampling", "backends",
                 "device", "executor", "engine", "process")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _owner(name: str) -> str | None:
    """The module of ours that `name` (a module, or a name in one) resolves to."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imported(module: str, path: Path) -> set[str]:
    """Every module of ours `module` imports, anywhere in its file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")[: None if path.name == "__init__.py" else -1]
                base = ".".join(package[: len(package) - node.level + 1] + [base]).strip(".")
            names |= {f"{base}.{alias.name}" for alias in node.names} | {base}
    owners = {_owner(n) for n in names} - {None, module}
    return {o for o in owners if not module.startswith(o + ".")}   # a package's own init


GRAPH = {module: _imported(module, path) for module, path in MODULES.items()}


def _top(module: str) -> str:
    return module.split(".")[0]


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_imports_only_the_layers_below_it(package):
    wrong = sorted(f"{m} -> {d}" for m, deps in GRAPH.items() if _top(m) == package
                   for d in deps if _top(d) != package and _top(d) not in _allowed(m))
    assert wrong == []


def _allowed(module: str) -> set[str]:
    if module == COMMAND or module.startswith(COMMAND + "."):
        return COMMAND_ALLOWED
    return ALLOWED[_top(module)]


# Layers that must run where torch is not installed or not wanted: the shared contract
# and the generated tables (codegen and `v4serve plan` read them), the scheduler's core,
# the text side and the capacity planner.
TORCH_FREE = ("contract", "generated", "runtime.core", "runtime.text", "runtime.planning")


@pytest.mark.parametrize("layer", TORCH_FREE)
def test_torch_free_layers_import_no_torch(layer):
    heavy = {"torch"} | ({"numpy"} if _top(layer) in ("contract", "generated") else set())
    wrong = []
    for module, path in MODULES.items():
        if module == layer or module.startswith(layer + "."):
            imports = _third_party(path)
            wrong += [f"{module} imports {name}" for name in sorted(imports & heavy)]
    assert wrong == []


def _third_party(path: Path) -> set[str]:
    """The top-level names of every module a file imports."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_runtime_parts_import_only_the_parts_below_them():
    rank = {part: i for i, part in enumerate(RUNTIME_PARTS)}
    wrong = []
    for module, deps in GRAPH.items():
        part = _part(module)
        for dep in deps:
            if part is not None and _part(dep) is not None and rank[_part(dep)] > rank[part]:
                wrong.append(f"{module} -> {dep}")
    assert sorted(wrong) == []


def _part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "runtime" and len(parts) > 1 else None


def test_no_module_imports_itself_in_a_circle():
    assert _cycles(GRAPH) == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while component[-1:] != [v]:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_check_finds_a_planted_cycle():
    graph = defaultdict(set, {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert _cycles(graph) == [["a", "b", "c"]]


def test_an_upward_import_is_caught_even_inside_a_function(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n"
                       "    from codegen.plan import Plan\n"
                       "    from .engine import Engine\n")
    deps = _imported("runtime.engine.planted", planted)
    assert deps == {"codegen.plan", "runtime.engine.engine"}
    assert "codegen" not in _allowed("runtime.engine.planted")
