"""Graph functions, compiled once and kept on disk.

A key names one graph ("block[csa] S=2"). In "compile" mode each is compiled with
torch.compile (fullgraph: a graph break or a host sync is an error) ahead of time into a
saved artifact under V4SERVE_CACHE_DIR (default ~/.cache/v4serve); a later start loads
the artifact in a fraction of a second instead of tracing and compiling again. An
artifact is found by a signature: the key, the code it was compiled from, and the
static structure of the call (dtypes, every fixed dimension, the Python values); the
dimensions that vary from call to call (the rows in use, the entries of a context
bucket, a pool's page count) are compiled dynamic, so one artifact serves every size
but 1 (a size of 1 is a graph of its own). Checks are the signature's: the loaded graph
runs without dynamo's guards.

"eager" runs every graph as it is (npu, `--enforce-eager`); "trace" only traces each
one (dynamo, fullgraph, no code generation): the check that no launch breaks a graph.
With `defer`, a graph whose artifact is not there yet runs eagerly, and is picked up
as soon as another process (runtime/process/precompile.py) has saved it.

Processes share the cache: a graph is compiled by one process at a time (a file lock on
its artifact), and the others waiting for it load what it saved, so the rank processes
of an mp engine compile each graph once between them. Inductor's own cache (the C++ a
loaded graph runs) lives beside the artifacts, under the same directory: an artifact
whose C++ is not in it compiles its C++ again as it loads (seconds per graph).
"""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

log = logging.getLogger("v4serve.graphs")
MODES = ("compile", "cudagraph", "eager", "trace")
Dynamic = tuple[tuple[torch.Tensor, int], ...]      # (tensor, dimension that varies)


def cache_dir() -> Path:
    return Path(os.environ.get("V4SERVE_CACHE_DIR", Path.home() / ".cache" / "v4serve"))


def _configure() -> None:
    # set, not defaulted: an earlier compile in this process (torch sets the variable
    # on first use) must not send this cache's C++ elsewhere
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir() / "inductor")
    torch._dynamo.config.cache_size_limit = 256
    torch._dynamo.config.accumulated_cache_size_limit = 4096
    torch._dynamo.config.automatic_dynamic_shapes = False   # only what we mark varies
    torch._inductor.config.cpp_wrapper = True   # the graph's launches from C++, not Python


def default_mode(device: torch.device) -> str:
    return {"cpu": "compile", "cuda": "cudagraph"}.get(device.type, "eager")


def _code_version() -> str:
    """A hash of the code graphs are compiled from, and of the torch that compiles them."""
    root = Path(__file__).resolve().parents[2]              # runtime/
    digest = hashlib.sha256(torch.__version__.encode())
    for folder in ("backends/compiled", "model"):
        for path in sorted((root / folder).glob("*.py")):
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


class Graphs:
    """The graph functions of one backend, by key. In "cudagraph" mode the graphs are
    compiled as in "compile"; the backend captures whole launches over them."""

    def __init__(self, mode: str, defer: bool = False):
        if mode not in MODES:
            raise ValueError(f"graph mode {mode!r}; one of {', '.join(MODES)}")
        if mode != "eager":
            _configure()
        self.mode, self.defer = mode, defer
        self.seconds: dict[str, float] = {}          # graph -> its compile or load seconds
        self.compiled: set[str] = set()              # graphs this process compiled itself
        self.missing: set[str] = set()               # signatures run eagerly for want of one
        self._fns: dict[str, Callable] = {}
        self._signatures: dict[tuple, str] = {}
        self._store = cache_dir() / "graphs" / _code_version() if mode != "eager" else None

    @property
    def compiling(self) -> bool:
        return self.mode != "eager"

    def run(self, key: str, fn: Callable, *args, dynamic: Dynamic = (), owner: int = 0):
        """fn(*args) through the graph of `key`; each (tensor, dim) of `dynamic` varies.
        The static structure of the arguments is taken to be the same for every call of
        one key by one `owner` (a model), so its signature is computed once."""
        if not self.compiling:
            return fn(*args)
        ones = tuple(t.shape[d] == 1 for t, d in dynamic)
        memo = (key, owner, ones)
        signature = self._signatures.get(memo)
        dynamic = tuple((t, d) for t, d in dynamic if t.shape[d] > 1)
        if signature is None:
            signature = self._signatures[memo] = _signature(key, args, dynamic)
        compiled = self._fns.get(signature)
        if compiled is None:
            label = key + (" rows=1" if any(ones) else "")
            compiled = self._graph(label, signature, fn, args, dynamic)
            if compiled is None:                     # deferred: eager until it is saved
                return fn(*args)
        return compiled(*args)

    def _graph(self, key: str, signature: str, fn: Callable, args: tuple,
               dynamic: Dynamic) -> Callable | None:
        start = time.perf_counter()
        if self.mode == "trace":
            self._mark(dynamic)
            graph = torch.compile(fn, fullgraph=True, dynamic=None, backend="eager")
        else:
            path = self._path(key, signature)
            graph = _load_or_discard(key, path)
            if graph is None and self.defer:
                self.missing.add(signature)
                return None
            if graph is None:
                graph = self._compile_once(key, fn, args, dynamic, path)
        self._fns[signature] = graph
        self.seconds[key] = time.perf_counter() - start
        self.missing.discard(signature)
        log.info("graph %s ready in %.1f s", key, self.seconds[key])
        return graph

    def _compile_once(self, key: str, fn: Callable, args: tuple, dynamic: Dynamic,
                      path: Path) -> Callable:
        """Compile and save the graph, or load it if another process saved it while
        this one waited for the lock."""
        with _locked(path):
            if (graph := _load_or_discard(key, path)) is not None:
                return graph
            self._mark(dynamic)
            self.compiled.add(key)
            return self._compile(fn, args, path)

    def _compile(self, fn: Callable, args: tuple, path: Path) -> Callable:
        compiled = torch.compile(fn, fullgraph=True, dynamic=None).aot_compile((args, {}))
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        compiled.save_compiled_function(str(partial))
        partial.replace(path)                        # whole or absent, never half-written
        compiled.disable_guard_check()
        return compiled

    def _path(self, key: str, signature: str) -> Path:
        return self._store / f"{re.sub(r'[^A-Za-z0-9=.-]+', '_', key)}-{signature}.aot"

    @staticmethod
    def _mark(dynamic: Dynamic) -> None:
        for tensor, dim in dynamic:
            torch._dynamo.mark_dynamic(tensor, dim)

    def pending(self) -> int:
        """Graphs still run eagerly, waiting for an artifact."""
        return len(self.missing)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the artifact at `path` (a file beside it) while inside;
    released when the process exits, whatever happens."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _load_or_discard(key: str, path: Path) -> Callable | None:
    """The graph saved at `path`; None if there is none, or if it does not load (saved
    by another torch or compiler, its C++ not rebuildable here, a damaged file): then it
    is removed, so that it is compiled again, and the start goes on."""
    if not path.exists():
        return None
    try:
        return _load(path)
    except Exception as exc:  # noqa: BLE001 - any failure to load means: compile again
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log.warning("graph %s: its saved artifact %s does not load (%s); compiling it again",
                    key, path.name, reason[:200])
        path.unlink(missing_ok=True)
        return None


def _load(path: Path) -> Callable:
    with open(path, "rb") as f:
        graph = torch.compiler.load_compiled_function(f)
    graph.disable_guard_check()
    return graph


def _signature(key: str, args: tuple, dynamic: Dynamic) -> str:
    """A hash of the key and of what the compiled graph fixes about its arguments."""
    varying = {id(t): d for t, d in dynamic}
    digest = hashlib.sha256(key.encode())
    _describe(args, varying, digest)
    return digest.hexdigest()[:16]


def _describe(value, varying: dict[int, int], digest) -> None:
    if isinstance(value, torch.Tensor):
        shape = [None if varying.get(id(value)) == d else n for d, n in enumerate(value.shape)]
        digest.update(repr(("T", value.dtype, shape, value.device.type)).encode())
    elif isinstance(value, dict):
        for name in sorted(value):
            digest.update(repr(name).encode())
            _describe(value[name], varying, digest)
    elif isinstance(value, (list, tuple)):
        digest.update(f"[{len(value)}".encode())
        for item in value:
            _describe(item, varying, digest)
    elif dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            if not callable(getattr(value, f.name)):
                digest.update(f.name.encode())
                _describe(getattr(value, f.name), varying, digest)
    else:
        digest.update(repr(value).encode())
