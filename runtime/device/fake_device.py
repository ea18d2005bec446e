"""A fake cuda or npu device on a torch build that has neither, for fake tensors.

Under FakeTensorMode a tensor on `cuda:0` or `npu:0` has no storage, and every aten op
takes it; what refuses is the device guard a few of torch's Python bindings take before
they dispatch (`Tensor.to`, `copy_`, indexing, `~`, `contiguous`, `nonzero`), which
asks the build for the device's guard: "PyTorch is not linked with support for cuda
devices" on a CPU build.

- npu is torch_npu's name for the privateuse1 device; torch lets Python register a guard
  for it, so `fake_device("npu")` names privateuse1 "npu" and registers torch's dummy
  guard and a module that says no npu is available (once, for the process: torch has
  no way back; where torch_npu has named it, nothing is done).
- cuda's guard cannot be registered from Python, so `fake_device("cuda")` routes those
  bindings to the aten ops they call, which dispatch to the fake tensors with no guard.
  The rest of torch is untouched; on a build with CUDA nothing is routed.
- npu takes the same routes: `Tensor.to` reaches FakeTensorMode as `aten.to` in some
  contexts, which it would run for real on a host constant (asking the npu for memory);
  as `aten._to_copy` the fake mode moves the constant without the device.
"""
from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode

aten = torch.ops.aten


@contextlib.contextmanager
def fake_device(kind: str) -> Iterator[torch.device]:
    """Within: fake tensors may live on `kind` (cpu, cuda, npu); yields its device 0."""
    if kind == "cpu":
        yield torch.device("cpu")
    elif kind == "npu":
        _name_npu()
        with _Unguarded():
            yield torch.device("npu", 0)
    elif kind == "cuda":
        with contextlib.nullcontext() if torch.backends.cuda.is_built() else _Unguarded():
            yield torch.device("cuda", 0)
    else:
        raise ValueError(f"device {kind!r}: cpu, cuda or npu")


def _name_npu() -> None:
    if torch._C._get_privateuse1_backend_name() == "npu":   # torch_npu, or done before
        return
    from torch.utils import backend_registration as registration

    class Absent(registration._DummyBackendModule):
        """No npu is there: FakeTensorMode then makes `torch.tensor(data, device=npu)`
        on the host and moves it as a fake, instead of asking the device for storage."""

        def is_available(self) -> bool:
            return False

    registration._setup_privateuseone_for_python_backend("npu", backend_module=Absent())


class _Unguarded(TorchFunctionMode):
    """The guarded Tensor bindings, as the aten ops they dispatch."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        route = _ROUTES.get(func)
        return route(*args, **kwargs) if route else func(*args, **kwargs)


def _to(x: torch.Tensor, *args, copy: bool = False, **kwargs) -> torch.Tensor:
    device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
    device = x.device if device is None else torch.device(device)
    dtype = x.dtype if dtype is None else dtype
    if device == x.device and dtype == x.dtype and not copy and memory_format is None:
        return x
    return aten._to_copy(x, dtype=dtype, device=device, non_blocking=non_blocking,
                         memory_format=memory_format)


def _basic(x: torch.Tensor, key) -> tuple[torch.Tensor, list | None]:
    """x[key] as torch indexes: ints, slices, None and Ellipsis as views first, then the
    tensor (advanced) indices over what is left, as aten.index's list (None: there are
    none)."""
    key = key if isinstance(key, tuple) else (key,)
    used = sum(_dims_taken(k) for k in key)
    view, dim, advanced = x, 0, {}
    for k in key:
        if k is Ellipsis:
            dim += x.dim() - used
        elif k is None:
            view, dim = aten.unsqueeze(view, dim), dim + 1
        elif isinstance(k, slice):
            step = 1 if k.step is None else k.step
            view, dim = aten.slice.Tensor(view, dim, k.start, k.stop, step), dim + 1
        elif isinstance(k, torch.Tensor) or isinstance(k, (list, tuple)):
            index = k if isinstance(k, torch.Tensor) else torch.tensor(k, device=x.device)
            advanced[dim] = index
            dim += _dims_taken(index)
        else:
            view = aten.select.int(view, dim, operator.index(k))
    if not advanced:
        return view, None
    return view, [advanced.get(d) for d in range(max(advanced) + 1)]


def _dims_taken(k) -> int:
    if k is None or k is Ellipsis:
        return 0
    if isinstance(k, torch.Tensor) and k.dtype == torch.bool:
        return k.dim()
    return 1


def _getitem(x: torch.Tensor, key) -> torch.Tensor:
    view, index = _basic(x, key)
    return view if index is None else aten.index.Tensor(view, index)


def _setitem(x: torch.Tensor, key, value) -> None:
    view, index = _basic(x, key)
    if not isinstance(value, torch.Tensor):
        value = torch.tensor(value, dtype=x.dtype, device=x.device)
    if index is None:
        aten.copy_(view, value)
    else:
        aten.index_put_(view, index, value)


_ROUTES = {
    torch.Tensor.to: _to,
    torch.Tensor.__getitem__: _getitem,
    torch.Tensor.__setitem__: _setitem,
    torch.Tensor.copy_: lambda x, src, non_blocking=False: aten.copy_(x, src, non_blocking),
    torch.Tensor.__invert__: lambda x: aten.bitwise_not(x),
    torch.Tensor.contiguous: lambda x, memory_format=torch.contiguous_format:
        aten.contiguous(x, memory_format=memory_format),
    torch.Tensor.nonzero: lambda x, as_tuple=False:
        aten.nonzero_numpy(x) if as_tuple else aten.nonzero(x),
}
