"""The EngineClient seam: AsyncEngine and CoreClient each declare every member of the
protocol, of the same kind (method or attribute) and with its parameters, and nothing
public beyond it but the extras listed here; so a member added to one client and not to
the other, or to neither's protocol, fails here rather than in the server."""
from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from runtime.engine.async_engine import AsyncEngine
from runtime.engine.client import EngineClient
from runtime.process.core_client import CoreClient

# what each client has beyond the protocol, and who reads it
EXTRAS = {
    AsyncEngine: {"engine",        # the Engine it steps (tests, offline inspection)
                  "run_locked",    # fn(engine) between two steps (tests)
                  "error"},        # why the step loop stopped
    CoreClient: {"config", "spec",           # server/cli builds the state from them
                 "process",                  # the core's Popen (server/cli)
                 "on_ready", "on_dead",      # server/cli's callbacks
                 "error"},                   # why the core stopped
}


def declared(cls: type) -> set[str]:
    """Public names the class's own source defines: methods, class attributes, and
    attributes it assigns on self."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    names = set()
    for node in tree.body[0].body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    names |= {node.attr for node in ast.walk(tree)
              if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id == "self"}
    return {n for n in names if not n.startswith("_")}


MEMBERS = declared(EngineClient)


def _is_method(cls: type, name: str) -> bool:
    return inspect.isfunction(inspect.getattr_static(cls, name, None))


def test_the_protocol_names_what_the_server_uses():
    assert {"generate", "stream", "abort", "start", "shutdown", "ready", "healthy",
            "num_in_flight", "summary", "snapshot", "tokenizer", "admission", "kind",
            "pid"} == MEMBERS


@pytest.mark.parametrize("cls", [AsyncEngine, CoreClient], ids=lambda c: c.__name__)
def test_each_client_declares_the_protocol_and_nothing_more(cls):
    assert EngineClient in cls.__mro__              # declared, not only shaped alike
    own = declared(cls)
    assert MEMBERS - own == set(), "protocol members the client does not define itself"
    assert own - MEMBERS - EXTRAS[cls] == set(), "public members outside the protocol"
    assert cls.kind in ("thread", "process")


@pytest.mark.parametrize("cls", [AsyncEngine, CoreClient], ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", sorted(MEMBERS))
def test_each_member_has_the_protocols_kind_and_parameters(cls, name):
    assert _is_method(cls, name) == _is_method(EngineClient, name)
    if _is_method(EngineClient, name):
        want = list(inspect.signature(getattr(EngineClient, name)).parameters)
        params = inspect.signature(getattr(cls, name)).parameters
        assert list(params)[: len(want)] == want
        extra = list(params.values())[len(want):]
        assert all(p.default is not inspect.Parameter.empty for p in extra)
