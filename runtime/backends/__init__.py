"""Kernel backends: the registry the generated launch wrappers dispatch through.

A backend implements `launch(kernel, args)` for the kernel kinds it supports. Backends
register a factory by name; `get_backend` builds one on first use and its error lists
the registered names.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from runtime.device.abi import KernelABI


class Backend(Protocol):
    name: str

    def launch(self, kernel: KernelABI, args: tuple) -> None:
        """Run `kernel` on the positional `args` built by its wrapper's marshal()."""


_FACTORIES: dict[str, Callable[[], Backend]] = {}
_INSTANCES: dict[str, Backend] = {}


class UnknownBackendError(KeyError):
    def __str__(self) -> str:
        return self.args[0]


def register_backend(name: str, factory: Callable[[], Backend]) -> None:
    """Make `factory` the builder of backend `name` (replacing any earlier one)."""
    _FACTORIES[name] = factory
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
