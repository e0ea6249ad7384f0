"""Kernel side of grading: run the student's code on the grader's cases and hand back plain arrays.

A graded test cell ends with::

    from decoder_course.harvest import collect; collect("causal_mask", globals())

Outside a grading run this does nothing. During one, the trusted grader has written the cases of each exercise as
plain data into the folder named by ``$DECODER_COURSE_HARVEST``; ``collect`` follows each case's steps (build this
object, load these weights, call that method with these arrays) and saves what came back as ``.npz`` arrays plus a
JSON description of their types. It never decides anything: the verdict is made outside the kernel, by a process
that trusts none of these files (it loads them with ``allow_pickle=False`` and checks every type, dtype and shape).
There is no reference code or reference value in this module or in the case files.

The case language (JSON) is small on purpose:

``{"id": "c0", "steps": [step, ...]}`` where a step is one of

- ``{"call": VALUE, "args": [VALUE...], "kwargs": {name: VALUE}, "let": name?, "record": name?,
  "autocast": dtype?}``   with ``"autocast": "bfloat16"`` (or ``"float16"``) the call runs inside
  ``torch.autocast(device_type, dtype=...)`` for the device of the call's tensors (cpu when none), as
  mixed-precision code does
- ``{"load_state": name, "state": {param: VALUE}, "lenient": [prefix]?}``   load a state dict (strict) into a
  bound module; keys under a ``lenient`` prefix (a submodule built by another exercise) only where it has them
- ``{"eval": name}`` / ``{"train": name}``            switch a bound module's mode
- ``{"seed": int}``                                   ``torch.manual_seed``
- ``{"backward": name, "weights": VALUE}``            ``(bound * weights).sum().backward()``
- ``{"let": name, "value": VALUE}``                   bind a value (to record it again after a call)
- ``{"record": name, "value": VALUE}``                record any value
- ``{"spy": [name, ...], "steps": [step, ...]}``      follow ``steps`` recording every call of those notebook
  functions (or methods of those classes) as ``~name/i`` (``args``, ``kwargs``, ``out``, ``after``: the
  arguments after the call)

and a VALUE is a JSON literal or one of ``{"array": key}``, ``{"tensor": key, "requires_grad": bool}``,
``{"ref": name}``, ``{"global": name}`` (the student's object), ``{"attr": [name, attr, ...]}``,
``{"index": [name, i]}``, ``{"grad": name}``, ``{"np_dtype": "float32"}``, ``{"torch_dtype": "float16"}``,
``{"generator": seed}``, ``{"new": "decoder_course.module:Name", "args": [...], "kwargs": {...}}``,
``{"list": [...]}``, ``{"tuple": [...]}``, ``{"dict": {...}}``.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

ENV_VAR = "DECODER_COURSE_HARVEST"
MAX_ERROR_CHARS = 2000
MAX_OUTPUT_BYTES = 32 << 20  # what one exercise may hand back; more is reported as an error, never written
MAX_VALUES = 10_000  # arrays and descriptions recorded per case


_VALUE_KINDS = (
    "array", "tensor", "ref", "global", "attr", "index", "grad", "np_dtype", "torch_dtype", "generator", "new",
    "list", "tuple", "dict",
)


class _CaseError(Exception):
    """A case could not be followed (bad reference, missing global): recorded, never raised to the student."""


def _torch():
    import torch  # imported lazily: the NumPy lessons never pay for it

    return torch


def _device_type(values) -> str:
    """The device type of the first tensor among ``values`` (what autocast must cover), else "cpu"."""
    torch = _torch()
    return next((v.device.type for v in values if isinstance(v, torch.Tensor)), "cpu")


class _Runner:
    """Follows the steps of one case against the notebook's namespace."""

    def __init__(self, namespace: dict, arrays: Any):
        self.namespace = namespace
        self.arrays = arrays
        self.bound: dict[str, Any] = {}
        self.leaves: dict[str, np.ndarray] = {}
        self.meta: dict[str, dict] = {}

    # -- values -------------------------------------------------------------------------------------------------
    def value(self, spec: Any) -> Any:
        if not isinstance(spec, dict):
            if isinstance(spec, list):
                return [self.value(item) for item in spec]
            return spec  # a JSON literal: int, float, str, bool, None
        kind = next((name for name in _VALUE_KINDS if name in spec), None)
        arg = spec.get(kind)
        if kind == "array":
            return np.array(self.arrays[arg], copy=True)
        if kind == "tensor":
            torch = _torch()
            tensor = torch.from_numpy(np.array(self.arrays[arg], copy=True))
            if spec.get("dtype"):
                tensor = tensor.to(getattr(torch, spec["dtype"]))
            if spec.get("requires_grad"):
                tensor.requires_grad_(True)
            return tensor
        if kind == "ref":
            return self.bound[arg]
        if kind == "global":
            if arg not in self.namespace:
                raise _CaseError(f"`{arg}` is not defined in your notebook: did you rename or delete it?")
            return self.namespace[arg]
        if kind == "attr":
            obj = self.bound[arg[0]]
            for name in arg[1:]:
                obj = getattr(obj, name)
            return obj
        if kind == "index":
            return self.bound[arg[0]][arg[1]]
        if kind == "grad":
            return self.bound[arg].grad
        if kind == "np_dtype":
            return np.dtype(arg)
        if kind == "torch_dtype":
            return getattr(_torch(), arg)
        if kind == "generator":
            return _torch().Generator().manual_seed(int(arg))
        if kind == "new":
            module_name, _, attr = arg.partition(":")
            if not module_name.startswith("decoder_course."):
                raise _CaseError(f"refusing to build {arg!r}: only decoder_course objects may be built")
            cls = getattr(importlib.import_module(module_name), attr)
            return cls(*self.value(spec.get("args", [])), **self._kwargs(spec.get("kwargs", {})))
        if kind == "list":
            return [self.value(item) for item in arg]
        if kind == "tuple":
            return tuple(self.value(item) for item in arg)
        if kind == "dict":
            return {key: self.value(item) for key, item in arg.items()}
        raise _CaseError(f"unknown value kind {kind!r}")

    def _kwargs(self, specs: dict) -> dict:
        return {name: self.value(spec) for name, spec in specs.items()}

    # -- steps --------------------------------------------------------------------------------------------------
    def step(self, step: dict) -> None:
        if "call" in step:
            fn = self.value(step["call"])
            args, kwargs = self.value(step.get("args", [])), self._kwargs(step.get("kwargs", {}))
            if step.get("autocast"):
                torch = _torch()
                with torch.autocast(_device_type([*args, *kwargs.values()]), dtype=getattr(torch, step["autocast"])):
                    result = fn(*args, **kwargs)
            else:
                result = fn(*args, **kwargs)
            if step.get("let"):
                self.bound[step["let"]] = result
            if step.get("record"):
                self.record(step["record"], result)
        elif "load_state" in step:
            module = self.bound[step["load_state"]]
            state = {name: self.value(spec) for name, spec in step["state"].items()}
            lenient = tuple(step.get("lenient", ()))
            if not lenient:
                module.load_state_dict(state, strict=True)
            else:  # parts built by the student's other exercises: their own cells judge their names
                own = set(module.state_dict())
                state = {k: v for k, v in state.items() if k in own or not k.startswith(lenient)}
                missing, unexpected = module.load_state_dict(state, strict=False)
                missing = [k for k in missing if not k.startswith(lenient)]
                if missing or unexpected:
                    said = [f"Missing key(s) in state_dict: {', '.join(map(repr, missing))}." if missing else "",
                            f"Unexpected key(s) in state_dict: {', '.join(map(repr, unexpected))}."
                            if unexpected else ""]
                    raise RuntimeError("Error(s) in loading state_dict: " + " ".join(filter(None, said)))
        elif "eval" in step:
            self.bound[step["eval"]].eval()
        elif "train" in step:
            self.bound[step["train"]].train()
        elif "seed" in step:
            _torch().manual_seed(int(step["seed"]))
        elif "backward" in step:
            out = self.bound[step["backward"]]
            weights = self.value(step["weights"])
            (out * weights).sum().backward()
        elif "let" in step and "value" in step:
            self.bound[step["let"]] = self.value(step["value"])
        elif "record" in step:
            self.record(step["record"], self.value(step["value"]))
        elif "spy" in step:
            self.spy(step["spy"], step.get("steps", []))
        else:
            raise _CaseError(f"unknown step {sorted(step)}")

    def spy(self, names: list, steps: list) -> None:
        """Follow ``steps`` with the notebook's ``names`` watched: every call of one of those functions (or of a
        method of one of those classes) is recorded as ``~name/i`` = its arguments and what it returned.

        An exercise built on the student's other exercises is then judged against *their* answers on the very
        inputs their code handed them, so a mistake elsewhere is not paid for twice. Nothing is decided here; the
        names are restored whatever happens.
        """
        saved = {name: self.namespace[name] for name in names if name in self.namespace}
        counts: dict[str, int] = {}
        try:
            for name, original in saved.items():
                self.namespace[name] = self._watched(name, original, counts)
            for step in steps:
                self.step(step)
        finally:
            self.namespace.update(saved)

    def _watched(self, name: str, original: Any, counts: dict) -> Any:
        runner = self

        def watch(label, fn):
            def watched(*args, **kwargs):
                index = counts.get(label, 0)
                counts[label] = index + 1
                key = f"~{label}/{index}"
                runner.record(f"{key}/args", list(args[1:] if label != name else args))  # copies, before the call
                runner.record(f"{key}/kwargs", {str(k): v for k, v in kwargs.items()})
                result = fn(*args, **kwargs)
                runner.record(f"{key}/out", result)
                runner.record(f"{key}/after", list(args[1:] if label != name else args))  # changed in place?
                return result

            return watched

        if not isinstance(original, type):
            return watch(name, original) if callable(original) else original
        methods = {attr: fn for attr, fn in vars(original).items()
                   if callable(fn) and not attr.startswith("_") and not isinstance(fn, type)}
        if hasattr(original, "forward") and "forward" not in methods:
            methods["forward"] = original.forward
        wrapped: dict[str, Any] = {attr: watch(f"{name}.{attr}", fn) for attr, fn in methods.items()}
        for attr, prop in vars(original).items():
            if isinstance(prop, property) and prop.fget is not None and not attr.startswith("_"):
                wrapped[attr] = property(watch(f"{name}.{attr}", prop.fget))
        return type(original.__name__, (original,), {**wrapped, "__qualname__": original.__qualname__,
                                                     "__module__": original.__module__})

    # -- recording ----------------------------------------------------------------------------------------------
    def record(self, name: str, value: Any) -> None:
        """Flatten ``value`` into plain arrays; anything else is described, never pickled."""
        if len(self.meta) >= MAX_VALUES:
            raise _CaseError(f"your code returned more than {MAX_VALUES} values")
        kind = type(value)
        if kind is np.ndarray:
            self._leaf(name, np.array(value, copy=True), "numpy.ndarray", str(value.dtype))
        elif kind.__module__ == "torch" and kind.__name__ in ("Tensor", "Parameter"):
            torch = _torch()
            tensor = value.detach().cpu()
            if tensor.dtype == torch.bfloat16:  # NumPy has no bfloat16: widen, keep the name
                array = tensor.float().numpy()
            else:
                array = tensor.numpy()
            self._leaf(name, np.array(array, copy=True), "torch.Tensor", str(value.dtype))
        elif kind in (bool, int, float):
            self._leaf(name, np.array(value), kind.__name__, kind.__name__)
        elif value is None:
            self.meta[name] = {"type": "None"}
        elif kind in (tuple, list):
            self.meta[name] = {"type": kind.__name__, "len": len(value)}
            for index, item in enumerate(value):
                self.record(f"{name}/{index}", item)
        elif kind is dict and all(isinstance(key, str) for key in value):
            self.meta[name] = {"type": "dict", "keys": sorted(value)}
            for key, item in value.items():
                self.record(f"{name}/{key}", item)
        else:
            # Subclasses of ndarray/Tensor land here on purpose: their comparisons could lie.
            self.meta[name] = {"type": f"{kind.__module__}.{kind.__qualname__}"}

    def _leaf(self, name: str, array: np.ndarray, type_name: str, dtype: str) -> None:
        if array.dtype == object:
            self.meta[name] = {"type": type_name + "[object]"}
            return
        self.leaves[name] = array
        self.meta[name] = {"type": type_name, "dtype": dtype, "shape": list(array.shape)}


@contextlib.contextmanager
def _unseen():
    """Whatever the student's code prints or displays on hidden cases is dropped: it would show hidden inputs."""
    try:
        from IPython import get_ipython
        from IPython.utils.capture import capture_output
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        with capture_output(stdout=True, stderr=True, display=True):
            yield
    else:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield


def collect(item: str, namespace: dict) -> None:
    """Run the grader's cases for ``item`` on the objects in ``namespace``; a no-op outside grading."""
    folder = os.environ.get(ENV_VAR)
    if not folder:
        return
    cases_path = Path(folder) / "cases" / f"{item}.json"
    if not cases_path.exists():
        return
    spec = json.loads(cases_path.read_text())
    with np.load(Path(folder) / "cases" / f"{item}.npz", allow_pickle=False) as npz:
        arrays = {key: npz[key] for key in npz.files}

    leaves: dict[str, np.ndarray] = {}
    report: dict[str, Any] = {"item": item, "cases": {}}
    for case in spec["cases"]:
        runner = _Runner(namespace, arrays)
        started = time.perf_counter()
        entry: dict[str, Any] = {}
        try:
            with _unseen():
                for step in case["steps"]:
                    runner.step(step)
        except NotImplementedError:
            entry["error"] = "NotImplementedError: the exercise is not written yet"
        except Exception as exc:  # the student's exception is data for the verdict, never a crash here
            lines = traceback.format_exception_only(type(exc), exc)
            entry["error"] = "".join(lines).strip()[:MAX_ERROR_CHARS]
        entry["seconds"] = round(time.perf_counter() - started, 4)
        entry["outputs"] = runner.meta
        report["cases"][case["id"]] = entry
        for name, array in runner.leaves.items():
            leaves[f"{case['id']}/{name}"] = array

    total = sum(array.nbytes for array in leaves.values())
    if total > MAX_OUTPUT_BYTES:  # too large to hand in: say so instead of filling the grading folder
        for entry in report["cases"].values():
            entry["error"] = (f"ValueError: your code returned {total / 2**20:.0f} MB of values, more than the "
                              f"{MAX_OUTPUT_BYTES / 2**20:.0f} MB that can be handed in for grading")
        leaves = {}
    out_dir = Path(folder) / "outputs"
    out_dir.mkdir(parents=True, exist_ok=True)
    # npz keys may not contain "/" portably: store an index instead.
    keys = sorted(leaves)
    np.savez(out_dir / f"{item}.npz", **{f"leaf{i}": leaves[key] for i, key in enumerate(keys)})
    report["leaves"] = keys
    (out_dir / f"{item}.json").write_text(json.dumps(report))
