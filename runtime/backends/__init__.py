"""Kernel backends: the registry the launchers (runtime/device/launcher.py) dispatch through.

A backend runs the launches of the kernel kinds it supports: `launch(kernel, args)` gets
one kernel's ABI and its arguments by name, as a launcher staged them. Backends register a
factory by name; `get_backend` builds one on first use (one instance per name, shared by
every launcher of the process) and its error lists the registered names.

What a backend can do is declared by attributes every backend has (the defaults of the
Backend protocol below, which a backend class subclasses); callers read them and never
probe for them:

    name            the name it registers under (a class may register variants, as
                    compiled-eager and compiled-trace of the compiled backend)
    compiles(dev)   whether its launches on `dev` run through compiled graphs: only then
                    has a warm-up (Engine.warmup, each rank worker's) anything to do
    graphs          those graphs (runtime/backends/compiled/graphs.py: mode, seconds,
                    pending()) once a launch has built them; None for a backend that
                    compiles nothing
    defer           set before the first launch (--defer-compile): a graph that is not
                    compiled yet runs eagerly until a background compile has saved it
    distributed     its MoE exchanges tokens between rank processes, so it can run
                    under the mp executor (one rank per process)
    eager_variant   the registered name of the same backend compiling nothing, run
                    instead under --enforce-eager; None: this one never compiles

Adding a backend: a module runtime/backends/<name>.py (or a package) with a class that
subclasses Backend, sets `name`, implements `launch` and overrides the capabilities it
has; then one register_backend line in _register_builtin below (or, outside this tree,
a register_backend call before the engine is built). A spec's `topology.backend` or
EngineConfig(backend=<name>) selects it; nothing else changes.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from contract.abi import KernelABI

if TYPE_CHECKING:
    import torch

    from runtime.backends.compiled.graphs import Graphs


class Backend(Protocol):
    """A kernel backend; subclass it for the capability defaults (an eager, one-process
    backend). See the module docstring for what each capability means."""

    name: str
    graphs: Graphs | None = None
    defer: bool = False
    distributed: bool = False
    eager_variant: str | None = None

    def launch(self, kernel: KernelABI, args: tuple) -> None:
        """Run `kernel` on the named `args` its launcher's marshal() built."""

    def compiles(self, device: torch.device) -> bool:
        """Whether launches on `device` run through compiled graphs."""
        return False


_FACTORIES: dict[str, Callable[[], Backend]] = {}
_INSTANCES: dict[str, Backend] = {}


class UnknownBackendError(KeyError):
    def __str__(self) -> str:
        return self.args[0]


def register_backend(name: str, factory: Callable[[], Backend]) -> None:
    """Make `factory` the builder of backend `name` (replacing any earlier one)."""
    _FACTORIES[name] = factory
    _INSTANCES.pop(name, None)


def unregister_backend(name: str) -> None:
    """Forget backend `name` (its factory and any instance built)."""
    _FACTORIES.pop(name, None)
    _INSTANCES.pop(name, None)


def supported_backends() -> list[str]:
    return sorted(_FACTORIES)


def get_backend(name: str) -> Backend:
    """The backend registered as `name`; the error lists the supported ones."""
    if name not in _INSTANCES:
        if name not in _FACTORIES:
            raise UnknownBackendError(
                f"unknown kernel backend {name!r}; supported: {', '.join(supported_backends())}")
        _INSTANCES[name] = _FACTORIES[name]()
    return _INSTANCES[name]


def _register_builtin() -> None:
    from runtime.backends.compiled import CompiledBackend
    from runtime.backends.dryrun import DryRunBackend
    from runtime.backends.torch_backend import TorchBackend

    register_backend(CompiledBackend.name, CompiledBackend)
    register_backend("compiled-eager", lambda: CompiledBackend(mode="eager"))
    register_backend("compiled-trace", lambda: CompiledBackend(mode="trace"))
    register_backend(DryRunBackend.name, DryRunBackend)
    register_backend(TorchBackend.name, TorchBackend)


_register_builtin()
