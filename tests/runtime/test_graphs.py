"""Graphs compile once into a saved artifact that a later process loads; with `defer`, a
graph without an artifact runs eagerly until another process has saved it."""
from __future__ import annotations

import pytest
import torch

from runtime.backends.compiled.graphs import Graphs

pytestmark = pytest.mark.slow


def scale(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return (x * factor).sin().sum(dim=-1)


def _run(graphs: Graphs, rows: int) -> torch.Tensor:
    x = torch.arange(rows * 4, dtype=torch.float32).view(rows, 4)
    return graphs.run("scale", scale, x, torch.tensor(0.5), dynamic=((x, 0),))


def test_a_graph_is_compiled_once_then_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv("V4SERVE_CACHE_DIR", str(tmp_path))
    first = Graphs("compile")
    want = scale(torch.arange(12.0).view(3, 4), torch.tensor(0.5))
    assert torch.allclose(_run(first, 3), want)
    artifacts = list(tmp_path.glob("graphs/*/scale-*.aot"))
    assert len(artifacts) == 1
    again = Graphs("compile")                      # a later start: loads, compiles nothing
    assert torch.allclose(_run(again, 3), want)
    assert torch.allclose(_run(again, 7), scale(torch.arange(28.0).view(7, 4),
                                                torch.tensor(0.5)))   # rows vary: one graph
    assert list(tmp_path.glob("graphs/*/scale-*.aot")) == artifacts
    assert again.seconds["scale"] < first.seconds["scale"]


def test_a_deferred_graph_runs_eagerly_until_its_artifact_appears(tmp_path, monkeypatch):
    monkeypatch.setenv("V4SERVE_CACHE_DIR", str(tmp_path))
    deferred = Graphs("compile", defer=True)
    want = scale(torch.arange(8.0).view(2, 4), torch.tensor(0.5))
    assert torch.allclose(_run(deferred, 2), want)
    assert deferred.pending() == 1 and not deferred.seconds
    _run(Graphs("compile"), 5)                     # "another process" compiles and saves it
    assert torch.allclose(_run(deferred, 2), want)
    assert deferred.pending() == 0 and "scale" in deferred.seconds


def test_engine_warmup_runs_every_launch_of_a_compiling_backend_only():
    from tests.model.support import reference_params
    from tests.runtime.engine_support import make_engine

    params = reference_params()
    for backend, warms in (("compiled-trace", True), ("compiled-eager", False),
                           ("torch", False)):
        engine = make_engine(params, backend=backend)
        calls = []
        engine.executor.warmup = lambda calls=calls: calls.append(1)
        engine.warmup()
        assert bool(calls) == warms, backend


def test_processes_compile_a_graph_once_between_them(tmp_path):
    """Two processes that need the same graph at once: one compiles it, the other
    waits for the lock and loads what it saved (an mp engine's rank processes)."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    script = ("import sys, torch\n"
              "from runtime.backends.compiled.graphs import Graphs\n"
              "from tests.runtime.test_graphs import _run\n"
              "graphs = Graphs('compile')\n"
              "out = _run(graphs, 3)\n"
              "print('compiled' if graphs.compiled else 'loaded', round(out.sum().item(), 5))\n")
    env = {**os.environ, "V4SERVE_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    said = sorted(p.communicate(timeout=300)[0].split() for p in procs)
    assert [p.returncode for p in procs] == [0, 0]
    assert [how for how, _ in said] == ["compiled", "loaded"]
    assert said[0][1] == said[1][1]                      # the same graph's result
    assert len(list(tmp_path.glob("graphs/*/scale-*.aot"))) == 1
    assert list(tmp_path.glob("inductor/*"))          # its C++ beside the artifacts


def test_an_artifact_that_does_not_load_is_compiled_again(tmp_path, monkeypatch, caplog):
    """A damaged or foreign artifact (another torch, a compiler that cannot rebuild its
    C++) never stops a start: it is discarded and compiled again, or with `defer` run
    eagerly until a compile saves it."""
    monkeypatch.setenv("V4SERVE_CACHE_DIR", str(tmp_path))
    want = scale(torch.arange(12.0).view(3, 4), torch.tensor(0.5))
    _run(Graphs("compile"), 3)
    (artifact,) = tmp_path.glob("graphs/*/scale-*.aot")
    artifact.write_bytes(b"not a saved graph")
    deferred = Graphs("compile", defer=True)
    assert torch.allclose(_run(deferred, 3), want)             # eager meanwhile
    assert deferred.pending() == 1 and not artifact.exists()
    assert "does not load" in caplog.text
    artifact.write_bytes(b"not a saved graph")
    again = Graphs("compile")
    assert torch.allclose(_run(again, 3), want)
    assert again.compiled == {"scale"} and artifact.stat().st_size > 100
