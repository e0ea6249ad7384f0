"""A pretend GPU on the CPU: tensors carry a *virtual* device, and mixing two devices fails as it does on CUDA.

The course must never need a GPU, yet its GPU path has to be tested here, on a CPU-only torch. Inside
``VirtualDevice("cuda")`` every tensor made by a Python-level torch call is labelled with the device it would have
on a real machine: ``device="cuda"`` in a factory, ``.to("cuda")`` / ``.cuda()`` / ``module.to(...)``, the common
device of an operation's inputs, and ``cpu`` for everything else (``torch.zeros(3)``, ``torch.from_numpy``).
The arithmetic runs on the CPU, so values are real; what the label adds is the failure a GPU gives:

- an operation whose tensor inputs carry two different devices raises ``RuntimeError: Expected all tensors to be
  on the same device`` (0-dim CPU tensors excepted, as on CUDA);
- ``.numpy()`` of a virtual-GPU tensor raises ``TypeError: can't convert cuda:0 device type tensor to numpy``;
- ``tensor.device`` and ``tensor.is_cuda`` report the virtual device.

Tensors made inside C++ without a Python call (autograd's gradients) carry no label and mix with anything. The
virtual device's ``synchronize`` calls are counted (``torch.cuda.synchronize`` is replaced while active).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

CPU = torch.device("cpu")


def _as_device(value: Any) -> torch.device | None:
    if isinstance(value, torch.device):
        return value
    if isinstance(value, str):
        try:
            return torch.device(value)
        except RuntimeError:
            return None
    if isinstance(value, int) and not isinstance(value, bool):
        return torch.device("cuda", value)
    return None


class _Labels:
    """``{tensor: device}`` by identity (a tensor's ``==`` is elementwise), forgetting a tensor when it dies."""

    def __init__(self):
        self._data: dict[int, tuple[weakref.ref, torch.device]] = {}

    def __setitem__(self, t: torch.Tensor, where: torch.device) -> None:
        key = id(t)
        self._data[key] = (weakref.ref(t, lambda _, key=key: self._data.pop(key, None)), where)

    def get(self, t: torch.Tensor, default=None):
        entry = self._data.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else default

    def __contains__(self, t: torch.Tensor) -> bool:
        return self.get(t) is not None

    def __getitem__(self, t: torch.Tensor) -> torch.device:
        return self.get(t)


def _normal(where: torch.device) -> torch.device:
    return torch.device(where.type, 0) if where.type == "cuda" and where.index is None else where


_UNCHECKED = {torch._has_compatible_shallow_copy_type, torch.Tensor.copy_, torch.Tensor.__repr__,
              torch.Tensor.__format__, torch.Tensor.__str__}


class VirtualDevice(TorchFunctionMode):
    """Run torch on the CPU while tracking which device each tensor would be on (see the module docstring)."""

    def __init__(self, name: str = "cuda"):
        super().__init__()
        self.target = _normal(torch.device(name))
        self.labels = _Labels()
        self.synchronized = 0
        self.mixed: list[str] = []  # every mismatch raised, for the test's report

    # -- labels ---------------------------------------------------------------------------------------------------
    def label(self, t: torch.Tensor) -> torch.device | None:
        return self.labels.get(t)

    def _mark(self, out: Any, where: torch.device) -> None:
        for leaf in tree_flatten(out)[0]:
            if isinstance(leaf, torch.Tensor):
                self.labels[leaf] = where

    def _devices(self, args, kwargs) -> set[torch.device]:
        found = set()
        for leaf in tree_flatten((args, kwargs))[0]:
            if isinstance(leaf, torch.Tensor):
                where = self.labels.get(leaf)
                if where is None or (where == CPU and leaf.dim() == 0):
                    continue  # unlabelled (made in C++), or a CPU scalar: both mix with anything
                found.add(where)
        return found

    def _strip(self, value: Any) -> Any:
        """The device argument as the CPU build can run it."""
        where = _as_device(value)
        return "cpu" if where is not None and where.type == self.target.type else value

    # -- the mode ------------------------------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        T = torch.Tensor
        if func == T.device.__get__:
            return self.labels.get(args[0], CPU)
        if func == T.is_cuda.__get__:
            return self.labels.get(args[0], CPU).type == "cuda"
        if func == T.data.__set__:  # module.to(): param.data = param.to(device)
            func(*args, **kwargs)
            if args[1] in self.labels:
                self.labels[args[0]] = self.labels[args[1]]
            return None
        if func is T.numpy and self.labels.get(args[0], CPU).type != "cpu":
            raise TypeError(f"can't convert {self.labels[args[0]]} device type tensor to numpy. Use Tensor.cpu() "
                            "to copy the tensor to host memory first.")
        if func in (T.cpu, T.cuda) or func is T.to:
            return self._move(func, args, kwargs)
        if func in _UNCHECKED:  # copying between devices is allowed, printing never moves
            return func(*args, **kwargs)
        target = None
        if kwargs.get("device") is not None:
            target = _normal(_as_device(kwargs["device"]) or CPU)
            kwargs["device"] = self._strip(kwargs["device"])
        devices = self._devices(args, kwargs)
        if len(devices) > 1:
            names = ", ".join(sorted(str(d) for d in devices))
            self.mixed.append(f"{getattr(func, '__name__', func)}: {names}")
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"{names}! (in {getattr(func, '__name__', func)}, VirtualDevice)")
        out = func(*args, **kwargs)
        self._mark(out, target or (devices.pop() if devices else CPU))
        return out

    def _move(self, func, args, kwargs):
        T = torch.Tensor
        x, rest = args[0], list(args[1:])
        source = self.labels.get(x, CPU)
        if func is T.cpu:
            where = CPU
        elif func is T.cuda:
            where = _normal(_as_device(rest[0]) if rest else torch.device("cuda"))
            rest, kwargs = [], {k: v for k, v in kwargs.items() if k == "non_blocking"}
            func = T.to
        else:  # Tensor.to(device | dtype | tensor, ...)
            where = source
            if kwargs.get("device") is not None:
                where = _normal(_as_device(kwargs["device"]))
                kwargs["device"] = "cpu"
            for i, value in enumerate(rest):
                if isinstance(value, torch.Tensor):
                    where = self.labels.get(value, CPU)
                    rest[i] = value.dtype  # the other tensor's dtype; its device is the label
                elif _as_device(value) is not None and not isinstance(value, int):
                    where = _normal(_as_device(value))
                    rest[i] = "cpu"
        if func is T.cpu:
            out = x.clone() if source != CPU else func(x, *rest, **kwargs)
        else:
            out = func(x, *rest, **kwargs)
            if where != source and out is x:
                out = x.clone()  # a real move makes a copy: the source keeps its own device
        self._mark(out, where)
        return out

    # -- synchronisation ------------------------------------------------------------------------------------------
    def __enter__(self):
        self._saved = torch.cuda.synchronize, torch.cuda.is_available

        def synchronize(device=None):
            self.synchronized += 1

        torch.cuda.synchronize = synchronize
        return super().__enter__()

    def __exit__(self, *exc):
        torch.cuda.synchronize, torch.cuda.is_available = self._saved
        return super().__exit__(*exc)


def labels_of(mode: VirtualDevice, tree: Any) -> Any:
    """The virtual devices of the tensors in ``tree`` (None for an unlabelled one)."""
    return tree_map(lambda t: mode.label(t) if isinstance(t, torch.Tensor) else t, tree)
