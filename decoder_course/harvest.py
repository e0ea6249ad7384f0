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
- ``{"spy": [name, ...], "steps": [step, ...], "answers": {label: [answer, ...]}?}``   follow ``steps``
  recording every call of those notebook functions (or methods of those classes) as ``~name/i`` (``args``,
  ``kwargs``, ``out``, ``after``: the arguments after the call). An answer ``{"args": [VALUE...], "kwargs":
  {name: VALUE}, "out": VALUE}`` whose arguments match a call's stands in for what it returned or raised
  (``~name/i/answered``; ``{"anything": true}`` matches any argument, a model say; an ``out`` of
  ``{"argument": i}`` or ``{"keyword": name}`` is the call's own argument). The trusted grader sends answers only
  in a further run of an exercise whose building block raised: a correct building block's answers to the calls
  the previous run recorded, on their own arguments, so that the exercise's own code runs on and is judged by
  itself

and a VALUE is a JSON literal or one of ``{"array": key}``, ``{"tensor": key, "requires_grad": bool}``,
``{"ref": name}``, ``{"global": name}`` (the student's object), ``{"attr": [name, attr, ...]}``,
``{"index": [name, i]}``, ``{"grad": name}``, ``{"np_dtype": "float32"}``, ``{"torch_dtype": "float16"}``,
``{"generator": seed}``, ``{"new": "decoder_course.module:Name", "args": [...], "kwargs": {...}}``,
``{"list": [...]}``, ``{"tuple": [...]}``, ``{"dict": {...}}``.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import io
import json
import os
import select
import signal
import struct
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from decoder_course.guard import Guard

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
        self.answers: dict[str, list] = {}  # a spy step's answers for calls that raise (see ``spy``)

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
            self.spy(step["spy"], step.get("steps", []), step.get("answers") or {})
        else:
            raise _CaseError(f"unknown step {sorted(step)}")

    def spy(self, names: list, steps: list, answers: dict | None = None) -> None:
        """Follow ``steps`` with the notebook's ``names`` watched: every call of one of those functions (or of a
        method of one of those classes) is recorded as ``~name/i`` = its arguments and what it returned.

        An exercise built on the student's other exercises is then judged against *their* answers on the very
        inputs their code handed them, so a mistake elsewhere is not paid for twice. Nothing is decided here; the
        names are restored whatever happens.
        """
        saved = {name: self.namespace[name] for name in names if name in self.namespace}
        counts: dict[str, int] = {}
        self.answers = {str(label): list(given) for label, given in (answers or {}).items()
                        if isinstance(given, list)}
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
                mark = len(runner.meta)
                given = list(args[1:] if label != name else args)
                answer = runner.answer(label, given, kwargs) if runner.answers else None  # before any change
                try:
                    result = fn(*args, **kwargs)
                except Exception:
                    if answer is None:
                        raise
                if answer is not None:
                    runner.forget_since(mark)  # the calls it made (before it raised): the answer replaces them
                    runner.record(f"{key}/answered", True)
                    result = runner.answer_value(answer["out"], given, kwargs)
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

    def answer(self, label: str, args: list, kwargs: dict) -> dict | None:
        """The grader's answer for a call of ``label``, when one was sent for these arguments (the first unused
        one: the same call made again, a cache's length step after step, gets the next)."""
        found = [given for given in self.answers.get(label, [])
                 if isinstance(given, dict) and self._matches(given.get("args", []), args)
                 and self._matches({"dict": given.get("kwargs", {})}, kwargs)]
        for given in found:
            if not given.get("used"):
                given["used"] = True
                return given
        return found[-1] if found else None

    def answer_value(self, spec: Any, args: list, kwargs: dict) -> Any:
        """An answer's value: ``{"argument": i}`` / ``{"keyword": name}`` is the call's own argument (the cache a
        step hands back), containers are followed, anything else is a VALUE."""
        if isinstance(spec, dict):
            if "argument" in spec:
                return args[int(spec["argument"])]
            if "keyword" in spec:
                return kwargs[str(spec["keyword"])]
            for kind, build in (("tuple", tuple), ("list", list)):
                if kind in spec:
                    return build(self.answer_value(item, args, kwargs) for item in spec[kind])
            if "dict" in spec:
                return {key: self.answer_value(item, args, kwargs) for key, item in spec["dict"].items()}
        if isinstance(spec, list):
            return [self.answer_value(item, args, kwargs) for item in spec]
        return self.value(spec)

    def forget_since(self, mark: int) -> None:
        """Drop the watched calls recorded after the first ``mark`` values (those made inside an answered call)."""
        for name in list(self.meta)[mark:]:
            if name.startswith("~"):
                del self.meta[name]
                self.leaves.pop(name, None)

    def _matches(self, spec: Any, value: Any) -> bool:
        """``value`` (what the student's code passed) is the argument ``spec`` describes."""
        if isinstance(spec, dict) and spec.get("anything") is True:
            return True
        if isinstance(spec, list) or (isinstance(spec, dict) and ("list" in spec or "tuple" in spec)):
            items = spec if isinstance(spec, list) else spec.get("list", spec.get("tuple"))
            return (isinstance(value, (list, tuple)) and len(items) == len(value)
                    and all(self._matches(s, v) for s, v in zip(items, value)))
        if isinstance(spec, dict) and "dict" in spec:
            items = spec["dict"]
            return (isinstance(value, dict) and set(items) == set(value)
                    and all(self._matches(items[k], value[k]) for k in items))
        expected = self.value(spec)
        if hasattr(expected, "detach") or isinstance(expected, np.ndarray):
            if not (hasattr(value, "detach") or isinstance(value, np.ndarray)):
                return False
            a = np.asarray(_plain(expected), dtype=np.float64)
            b = np.asarray(_plain(value), dtype=np.float64)
            return a.shape == b.shape and bool(np.allclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=True))
        if isinstance(expected, (bool, int, float)) and isinstance(value, (bool, int, float)):
            return bool(np.isclose(float(expected), float(value), rtol=1e-4, atol=1e-5, equal_nan=True))
        return type(expected) is type(value) and expected == value

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


def _plain(value: Any) -> np.ndarray:
    """A tensor's or array's values as a NumPy array (bfloat16 widened)."""
    if hasattr(value, "detach"):
        tensor = value.detach().cpu()
        return (tensor.float() if str(tensor.dtype) == "torch.bfloat16" else tensor).numpy()
    return np.asarray(value)


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
    """Run the grader's cases for ``item`` on the objects in ``namespace``; a no-op outside grading.

    The cases run in a forked child process (:func:`_collect_forked`): nothing the student's code keeps while
    running them (a global, a class or module attribute, a closure, a cache, the random state) comes back into the
    notebook, so no later cell can show a hidden input. Where ``os.fork`` does not exist they run here.
    """
    folder = os.environ.get(ENV_VAR)
    if not folder:
        return
    cases_path = Path(folder) / "cases" / f"{item}.json"
    if not cases_path.exists():
        return
    if hasattr(os, "fork"):
        _collect_forked(item, namespace, Path(folder))
    else:
        _collect_in_process(item, namespace, Path(folder))


def _load_cases(folder: Path, item: str) -> tuple[dict, dict]:
    spec = json.loads((folder / "cases" / f"{item}.json").read_text())
    with np.load(folder / "cases" / f"{item}.npz", allow_pickle=False) as npz:
        arrays = {key: npz[key] for key in npz.files}
    return spec, arrays


def _run_case(namespace: dict, arrays: dict, case: dict,
              caught: type[BaseException] = Exception) -> tuple[dict, dict]:
    """Follow one case: its report entry and the arrays it recorded. The student's exception is data.

    ``caught``: what counts as the student's exception. In the forked child it is every ``BaseException``
    (a ``SystemExit`` too: the child must still report); in the kernel itself an interrupt must go on up.
    """
    runner = _Runner(namespace, arrays)
    started = time.perf_counter()
    entry: dict[str, Any] = {}
    try:
        for step in case["steps"]:
            runner.step(step)
    except NotImplementedError:
        entry["error"] = "NotImplementedError: the exercise is not written yet"
    except caught as exc:  # the student's exception is data for the verdict, never a crash here
        lines = traceback.format_exception_only(type(exc), exc)
        entry["error"] = "".join(lines).strip()[:MAX_ERROR_CHARS] or type(exc).__name__
    entry["seconds"] = round(time.perf_counter() - started, 4)
    entry["outputs"] = runner.meta
    return entry, runner.leaves


def _write_report(out_dir: Path, item: str, report: dict, leaves: dict, total: int | None = None) -> None:
    """Write ``item``'s outputs (``.npz`` + ``.json``), each under a temporary name renamed into place: a reader
    finds a complete file or none, and a link or FIFO planted under the final name is replaced, never followed."""
    total = sum(array.nbytes for array in leaves.values()) if total is None else total
    if total > MAX_OUTPUT_BYTES:  # too large to hand in: say so instead of filling the grading folder
        for entry in report["cases"].values():
            entry["error"] = (f"ValueError: your code returned {total / 2**20:.0f} MB of values, more than the "
                              f"{MAX_OUTPUT_BYTES / 2**20:.0f} MB that can be handed in for grading")
        leaves = {}
    out_dir.mkdir(parents=True, exist_ok=True)
    # npz keys may not contain "/" portably: store an index instead.
    keys = sorted(leaves)
    report["leaves"] = keys
    partial = {suffix: out_dir / f".{item}.{os.getpid()}.partial{suffix}" for suffix in (".npz", ".json")}
    try:
        np.savez(partial[".npz"], **{f"leaf{i}": leaves[key] for i, key in enumerate(keys)})
        partial[".json"].write_text(json.dumps(report))
        for suffix, path in partial.items():
            os.replace(path, out_dir / f"{item}{suffix}")
    finally:
        for path in partial.values():
            with contextlib.suppress(OSError):
                path.unlink()


def _collect_in_process(item: str, namespace: dict, folder: Path) -> None:
    """The cases run in this process (no ``os.fork``): what the student's code keeps, it keeps."""
    spec, arrays = _load_cases(folder, item)
    leaves: dict[str, np.ndarray] = {}
    report: dict[str, Any] = {"item": item, "cases": {}}
    for case in spec["cases"]:
        with _unseen():
            entry, recorded = _run_case(namespace, arrays, case)
        report["cases"][case["id"]] = entry
        for name, array in recorded.items():
            leaves[f"{case['id']}/{name}"] = array
    _write_report(folder / "outputs", item, report, leaves)


# -- the cases in a forked child -------------------------------------------------------------------------------------
# The child follows the cases, sends each case's entry and arrays (JSON + an .npz, never a pickle) through a pipe and
# leaves with os._exit: no atexit handler, no flush, no IPython teardown. Before any student code runs it points
# fds 0-2 and sys.std* at /dev/null and cuts the kernel's ZMQ senders, so nothing it prints or displays reaches the
# notebook, and no message from it can corrupt the kernel's session. The parent reads, waits and writes the report.
# An item with rules (the cases' "forbidden") runs under the run-time guard (decoder_course.guard): a use of what it
# must be written without sends {"policy": rule} and ends the child; the report carries the rules as "policy".
_CHILD_FAILED = 70  # exit status of a child whose own machinery failed (not the student's code)
_MAX_PIPE_BYTES = 2 * MAX_OUTPUT_BYTES + (16 << 20)  # the most the parent reads from one child
_HEADER = struct.Struct(">QQ")  # before each message: the lengths of its JSON header and its .npz body
_MAX_REACHED = 16  # rules a child's guard may report (it reports one and exits: more is forged)


def _collect_forked(item: str, namespace: dict, folder: Path) -> None:
    """Run ``item``'s cases in a forked child; write what it handed back, or an error for each case it did not.

    An interrupt (nbclient's cell timeout) kills the child, is recorded for the unfinished cases, and is raised
    again once the report is written. A child that crashes, exits or hangs up costs its unfinished cases only.
    """
    ids = [str(case["id"]) for case in json.loads((folder / "cases" / f"{item}.json").read_text())["cases"]]
    readable, writable = os.pipe()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # the child must never see one
    try:
        pid = os.fork()
    except OSError as exc:  # e.g. the process limit: the cases are not run here instead
        os.close(readable)
        os.close(writable)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        _write_results(folder / "outputs", item, ids, {}, "OSError: the grader could not start a process to run "
                                                          f"your code on the hidden cases ({exc.strerror})")
        return
    if pid == 0:
        _child(item, namespace, folder, readable, writable, blocked)  # never returns
    data, status, stopped = _await_child(pid, readable, writable, blocked)
    results, done, unreadable, reached = _parse_child(data)
    if reached:
        why = (f"PolicyViolation: your code reached `{reached[0]}` while it ran on this case, and this exercise is "
               "written without it")
    elif stopped == "interrupted":
        why = "KeyboardInterrupt: interrupted: the cell ran past its time limit while your code ran on this case"
    elif stopped:
        why = f"ValueError: your code handed back more than {_MAX_PIPE_BYTES >> 20} MB"
    elif unreadable:
        why = "ValueError: what your code handed back could not be read"
    elif not done:
        why = _death(status)
    else:
        why = "the hidden checks ended before this case"
    _write_results(folder / "outputs", item, ids, results, why, reached)
    if stopped == "interrupted":
        raise KeyboardInterrupt


def _write_results(out_dir: Path, item: str, ids: list, results: dict, why: str, reached: list = ()) -> None:
    """The report of the cases in ``results``, and ``why`` for the first case missing (then "not run");
    ``reached``: the rules of the run-time policy the child reported broken (:mod:`decoder_course.guard`)."""
    report: dict[str, Any] = {"item": item, "cases": {}}
    if reached:
        report["policy"] = list(reached)
    leaves: dict[str, np.ndarray] = {}
    total, missing = 0, 0
    for case_id in ids:
        if case_id in results:
            entry, recorded, nbytes = results[case_id]
            total += nbytes
            for name, array in recorded.items():
                leaves[f"{case_id}/{name}"] = array
        else:
            error = why if not missing else f"not run: an earlier hidden case did not finish ({why.split(':')[0]})"
            entry, missing = {"error": error[:MAX_ERROR_CHARS], "seconds": 0.0, "outputs": {}}, missing + 1
        report["cases"][case_id] = entry
    _write_report(out_dir, item, report, leaves, total)


def _death(status: int | None) -> str:
    """What ended a child that did not finish, as the last line of a case's error."""
    if status is not None and os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        cause = {"SIGSEGV": " (a segmentation fault: a crash in C code)", "SIGXCPU": " (the CPU time limit)",
                 "SIGKILL": " (the memory limit, or killed)", "SIGABRT": " (aborted)"}.get(name, "")
        return f"Crashed: the process running your code on this case was killed by {name}{cause}"
    if status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) != _CHILD_FAILED:
        return (f"Exited: your code ended the process running it on this case (exit status "
                f"{os.WEXITSTATUS(status)}, e.g. os._exit) before it returned")
    return "the grader's process for the hidden cases failed before this case finished"


def _await_child(pid: int, fd: int, writable: int, blocked: set) -> tuple[bytes, int | None, str]:
    """Read the child's pipe until it ends; (what it sent, its wait status, why it was stopped or "").

    From the fork on, an interrupt (one held back during the fork arrives as the mask is restored) kills the
    child: no process is left running, none unreaped."""
    data, status, stopped, open_ = bytearray(), None, "", True
    try:
        os.close(writable)
        writable = -1
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        while status is None:
            if open_ and select.select([fd], [], [], 0.2)[0]:
                chunk = os.read(fd, 1 << 20)
                data += chunk
                open_ = bool(chunk)
                if len(data) > _MAX_PIPE_BYTES:
                    stopped = "too much"
                    break
                if chunk:
                    continue
            # EOF (the child, or whoever it forked, closed the pipe) or quiet: has the child ended?
            done, wait_status = os.waitpid(pid, 0 if not open_ else os.WNOHANG)
            if done:
                status = wait_status
        if status is not None and open_:  # what is left in the pipe (a grandchild may hold it open: no EOF)
            os.set_blocking(fd, False)
            with contextlib.suppress(BlockingIOError):
                while len(data) <= _MAX_PIPE_BYTES and (chunk := os.read(fd, 1 << 20)):
                    data += chunk
    except KeyboardInterrupt:
        stopped = "interrupted"
    finally:
        if status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            status = _reap(pid)
        os.close(fd)
        if writable >= 0:
            os.close(writable)
    return bytes(data), status, stopped


def _reap(pid: int) -> int | None:
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except KeyboardInterrupt:  # a second interrupt: the child is dying of SIGKILL, wait for it
            continue
        except ChildProcessError:
            return None


def _parse_child(data: bytes) -> tuple[dict, bool, bool, list]:
    """The cases the child handed back {id: (entry, arrays, bytes)}, whether it said it was done, whether
    anything it sent was unreadable (the child ran the student's code: nothing it sent is trusted), and the rules
    its guard reported broken (a few short strings; the trusted side keeps only the item's own rules)."""
    results: dict[str, tuple] = {}
    reached: list[str] = []
    position = 0
    try:
        while position + _HEADER.size <= len(data):
            head, body = _HEADER.unpack_from(data, position)
            start = position + _HEADER.size
            if start + head + body > len(data):
                break  # cut off: the child died while sending
            message = json.loads(bytes(data[start:start + head]))
            position = start + head + body
            if "policy" in message:  # the guard's report: the child exits right after it
                if len(reached) < _MAX_REACHED:
                    reached.append(str(message["policy"])[:200])
                continue
            if message.get("done"):
                return results, True, False, reached
            recorded = {}
            if body:
                with np.load(io.BytesIO(data[start + head:position]), allow_pickle=False) as npz:
                    recorded = {str(name): npz[f"leaf{i}"] for i, name in enumerate(message["leaves"])}
            results[str(message["id"])] = (dict(message["entry"]), recorded, int(message["nbytes"]))
    except Exception:
        return results, False, True, reached
    return results, False, False, reached


def _child(item: str, namespace: dict, folder: Path, readable: int, writable: int, blocked: set) -> None:
    """The forked child: run the cases, send the results, and leave by os._exit whatever happens."""
    status = _CHILD_FAILED
    try:
        gc.freeze()  # the parent's objects are never traversed here: a collection would copy every page they are on
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent is interrupted, and kills this process
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked - {signal.SIGINT})
        os.close(readable)
        _silence_child()
        if "torch" in sys.modules:  # the parent's OpenMP pool is not in this process: a parallel region would
            sys.modules["torch"].set_num_threads(1)  # wait for it forever (the kernel runs on one thread anyway)
        spec, arrays = _load_cases(folder, item)
        Guard(list(spec.get("forbidden") or ()), functools.partial(_stop, writable)).install(namespace)
        total = 0
        for case in spec["cases"]:
            entry, recorded = _run_case(namespace, arrays, case, caught=BaseException)
            nbytes = sum(array.nbytes for array in recorded.values())
            total += nbytes
            message: dict[str, Any] = {"id": case["id"], "entry": entry, "nbytes": nbytes}
            body = b""
            if recorded and total <= MAX_OUTPUT_BYTES:  # past the limit only the sizes are sent
                names = sorted(recorded)
                buffer = io.BytesIO()
                np.savez(buffer, **{f"leaf{i}": recorded[name] for i, name in enumerate(names)})
                message["leaves"], body = names, buffer.getvalue()
            _send(writable, json.dumps(message).encode(), body)
        _send(writable, b'{"done": true}', b"")
        status = 0
    except BaseException:
        status = _CHILD_FAILED
    finally:
        os._exit(status)


def _stop(fd: int, rule: str) -> None:
    """The guard's report (:mod:`decoder_course.guard`): send the rule reached, and end the child before the
    student's code runs another line (no handler can catch an exit, nor go on after it)."""
    try:
        _send(fd, json.dumps({"policy": str(rule)}).encode(), b"")
    finally:
        os._exit(_CHILD_FAILED)


def _send(fd: int, head: bytes, body: bytes) -> None:
    view = memoryview(_HEADER.pack(len(head), len(body)) + head + body)
    while view:
        view = view[os.write(fd, view):]


def _silence_child() -> None:
    """Nothing the child prints, displays or asks for reaches the kernel's streams or sockets (the child holds
    copies of them): fds 0-2 and sys.std* go to /dev/null and the kernel's message senders drop everything."""
    import builtins
    import faulthandler

    def drop(*args, **kwargs):
        return None

    def no_input(*args, **kwargs):
        raise EOFError("input() is not available while the hidden checks run")

    iostream, session = sys.modules.get("ipykernel.iostream"), sys.modules.get("jupyter_client.session")
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        if iostream is not None and isinstance(stream, iostream.OutStream):  # a reference kept by the student
            with contextlib.suppress(Exception):
                stream.write, stream.flush = (lambda text: len(text)), drop
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # C-level prints, faulthandler, the kernel's own log
        os.dup2(null, fd)
    if null > 2:
        os.close(null)
    sink = open(os.devnull, "w")  # noqa: SIM115 (held until os._exit)
    sys.stdout = sys.stderr = sys.__stdout__ = sys.__stderr__ = sink
    sys.stdin = sys.__stdin__ = open(os.devnull)  # noqa: SIM115
    sys.displayhook = drop
    builtins.input = no_input
    faulthandler.disable()  # it may hold another fd (pytest's dup of stderr): a crash here is the parent's to tell
    if "getpass" in sys.modules:
        sys.modules["getpass"].getpass = no_input
    if session is not None:
        session.Session.send = drop
    if iostream is not None:
        iostream.IOPubThread._really_send = drop
        iostream.IOPubThread.send_multipart = drop
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None:
        from IPython.core.displaypub import DisplayPublisher

        class Dropped(DisplayPublisher):
            def publish(self, *args, **kwargs):
                return None

            def clear_output(self, *args, **kwargs):
                return None

        shell.display_pub = Dropped(shell=shell)
