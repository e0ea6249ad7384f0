"""One mistake, one item: an exercise built on the student's other exercises is judged relative to their answers.

``masked_softmax`` calls the student's ``softmax``, ``MultiHeadAttention`` their ``split_heads``, ``decode_step``
their ``KVCache``. Judged against the reference alone, one wrong ``softmax`` would cost three items. An exercise
that declares ``uses = ("softmax", ...)`` is harvested with those names watched (harvest's ``spy`` step records
every call: its arguments and what the student's function returned). Here, on the trusted side:

1. the case is replayed with the reference code, each watched name answered by a *replayer*: when the student's
   code made the same call (the same arguments), the replayer returns what the student's own function returned,
   otherwise the reference's answer;
2. if every watched call was answered as the reference would have answered it, the student's building blocks
   were right where this exercise used them: the exercise's own ``judge`` decides, with its teaching messages;
3. otherwise the exercise is judged by consistency: its outputs must be the replay's (the reference built on the
   student's own building blocks). A mistake in ``softmax`` then costs ``softmax`` only.

No reference code or value enters the kernel: the replay runs here, on the recorded answers.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from types import ModuleType
from typing import Any
from unittest import mock

import numpy as np

from autograder.checks.framework import Case, Fail, Raised, Result, Unobservable

_OPAQUE = object()  # a recorded value that was described, not handed back (a model, a cache)
_RTOL, _ATOL = 1e-4, 1e-5


def watch(cases: list[Case], names: tuple[str, ...]) -> list[Case]:
    """Wrap every case's steps so that the kernel records the calls of the student's ``names``."""
    for case in cases:
        case.steps = [{"spy": list(names), "steps": case.steps}]
    return cases


# -- reading what the kernel recorded -----------------------------------------------------------------------------
def _rebuild(meta: dict, leaves: dict, case_id: str, name: str) -> Any:
    info = meta.get(name)
    if not isinstance(info, dict):
        return _OPAQUE
    kind = info.get("type")
    if kind in ("tuple", "list"):
        items = [_rebuild(meta, leaves, case_id, f"{name}/{i}") for i in range(int(info.get("len", 0)))]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        return {key: _rebuild(meta, leaves, case_id, f"{name}/{key}") for key in info.get("keys", [])}
    if kind == "None":
        return None
    leaf = leaves.get(f"{case_id}/{name}")
    if leaf is None:
        return _OPAQUE
    if kind == "numpy.ndarray":
        return leaf
    if kind == "torch.Tensor":
        import torch

        dtype = getattr(torch, str(info.get("dtype", "")).removeprefix("torch."), None)
        tensor = torch.from_numpy(np.array(leaf))
        return tensor.to(dtype) if isinstance(dtype, torch.dtype) else tensor
    if kind in ("int", "float", "bool"):
        return {"int": int, "float": float, "bool": bool}[kind](leaf.item())
    return _OPAQUE


class _Call:
    def __init__(self, args: list, kwargs: dict, out: Any, returned: bool, after: list):
        self.args, self.kwargs, self.out, self.returned, self.after = args, kwargs, out, returned, after


def _recorded_calls(result: Result, case_id: str) -> dict[str, list[_Call]]:
    meta = result.report_cases.get(case_id, {}).get("outputs", {})
    if not isinstance(meta, dict):
        return {}
    calls: dict[str, list[_Call]] = {}
    for key in meta:
        if not (isinstance(key, str) and key.startswith("~") and key.endswith("/args") and key.count("/") == 2):
            continue
        prefix = key[: -len("/args")]
        label = prefix[1:].rsplit("/", 1)[0]
        args = _rebuild(meta, result.leaves, case_id, key)
        kwargs = _rebuild(meta, result.leaves, case_id, f"{prefix}/kwargs")
        returned = f"{prefix}/out" in meta
        out = _rebuild(meta, result.leaves, case_id, f"{prefix}/out") if returned else None
        after = _rebuild(meta, result.leaves, case_id, f"{prefix}/after") if returned else None
        args = list(args) if isinstance(args, list) else []
        calls.setdefault(label, []).append(_Call(args, kwargs if isinstance(kwargs, dict) else {}, out, returned,
                                                 list(after) if isinstance(after, list) else args))
    return calls  # each label's calls in call order (the report keeps the kernel's order)


# -- comparing values ------------------------------------------------------------------------------------------
def _as_array(value: Any) -> np.ndarray | None:
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach") and hasattr(value, "dtype"):
        tensor = value.detach().cpu()
        if str(tensor.dtype) == "torch.bfloat16":
            tensor = tensor.float()
        return tensor.numpy()
    return None


def _same(a: Any, b: Any) -> bool:
    """Recorded ``b`` agrees with ``a`` (opaque parts of ``b`` agree with anything)."""
    if b is _OPAQUE:
        return True
    x, y = _as_array(a), _as_array(b)
    if x is not None or y is not None:
        if x is None or y is None or x.shape != y.shape:
            return False
        if x.dtype.kind in "fc" or y.dtype.kind in "fc":
            return bool(np.allclose(x.astype(np.float64), y.astype(np.float64), rtol=_RTOL, atol=_ATOL,
                                    equal_nan=True))
        return bool(np.array_equal(x, y))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(p, q) for p, q in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if a is None or b is None:
        return a is b
    if isinstance(a, (bool, int, float)) and isinstance(b, (bool, int, float)):
        return bool(np.isclose(float(a), float(b), rtol=_RTOL, atol=_ATOL, equal_nan=True))
    return True  # objects (a model, a generator): not compared


def _merge(recorded: Any, real: Any) -> Any:
    """The student's answer, with the parts that could not be handed back (objects) taken from the reference's."""
    if recorded is _OPAQUE:
        return real
    if isinstance(recorded, (list, tuple)) and isinstance(real, (list, tuple)) and len(recorded) == len(real):
        merged = [_merge(r, q) for r, q in zip(recorded, real, strict=True)]
        return tuple(merged) if isinstance(recorded, tuple) else merged
    return recorded


def _write(target: Any, value: Any) -> None:
    source = _as_array(value)
    if source is None:
        return
    if isinstance(target, np.ndarray) and target.shape == source.shape:
        target[...] = source
    elif hasattr(target, "copy_") and tuple(target.shape) == source.shape:
        import torch

        with torch.no_grad():
            target.copy_(torch.from_numpy(np.array(source)).to(target.dtype))


def _straight_through(answer: Any, real: Any) -> Any:
    """The student's values with the reference's gradient path (a replayed value has no graph of its own)."""
    if isinstance(answer, (list, tuple)) and isinstance(real, (list, tuple)) and len(answer) == len(real):
        items = [_straight_through(a, r) for a, r in zip(answer, real, strict=True)]
        return tuple(items) if isinstance(answer, tuple) else items
    if getattr(real, "requires_grad", False) and hasattr(answer, "detach") and answer.shape == real.shape:
        path = real.to(answer.dtype)  # the student's dtype too, with the reference's graph
        return path + (answer - path).detach()
    return answer


class _DependencyRaised(Exception):
    pass


# -- the replay ------------------------------------------------------------------------------------------------
class _Replay:
    def __init__(self, calls: dict[str, list[_Call]], required: tuple[str, ...] = ()):
        self.calls = calls
        self.differs: set[str] = set()
        self.required = set(required)  # labels the student's code must call as the reference does
        self.missing: list[str] = []

    def answer(self, label: str, signature: inspect.Signature | None, real_fn, args: tuple, kwargs: dict,
               skip_first: bool = False):
        call = self._find(label, signature, args, kwargs, skip_first)
        try:
            real = real_fn(*args, **kwargs)
        except Exception:
            if call is None:
                raise
            if not call.returned:
                raise _DependencyRaised(label) from None
            self.differs.add(label)
            return _merge(call.out, None)
        if call is None:
            if label in self.required:
                self.missing.append(label)
            return real
        if not call.returned:  # the student's raised where the reference's did not
            self.differs.add(label)
            raise _DependencyRaised(label)
        if not _same(real, call.out):
            self.differs.add(label)
        given = args[1:] if skip_first else args
        for arg, before, after in zip(given, call.args, call.after, strict=False):
            if not _same(before, after):  # the student's changed its argument in place: so does the replay
                self.differs.add(label)
                _write(arg, after)
        return _straight_through(_merge(call.out, real), real)

    def _find(self, label, signature, args, kwargs, skip_first) -> _Call | None:
        given = _bind(signature, args, kwargs, skip_first)
        found = []
        for call in self.calls.get(label, []):
            recorded = _bind(signature, tuple(call.args), call.kwargs, False, method=skip_first)
            if given is not None and recorded is not None:
                if given.keys() == recorded.keys() and all(_same(given[k], recorded[k]) for k in given):
                    found.append(call)
            elif _same(list(args[1 if skip_first else 0:]), call.args) and _same(kwargs, call.kwargs):
                found.append(call)
        if not found:
            return None
        # the same call made again (a cache's length, step after step): the answers in the order they were given
        fresh = [call for call in found if not getattr(call, "used", False)]
        call = (fresh or found)[-1 if not fresh else 0]
        call.used = True
        return call


def _bind(signature, args, kwargs, skip_first, method=False) -> dict | None:
    """Arguments by parameter name, defaults filled in (positional or keyword: the same call)."""
    if signature is None:
        return None
    try:
        if method:  # recorded method arguments come without self
            bound = signature.bind(None, *args, **kwargs)
        else:
            bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    values = dict(bound.arguments)
    if skip_first or method:
        values.pop(next(iter(signature.parameters)), None)
    return values


def _signature(fn) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _replayer(replay: _Replay, name: str, real: Any) -> Any:
    if not isinstance(real, type):
        signature = _signature(real)

        def replayed(*args, **kwargs):
            return replay.answer(name, signature, real, args, kwargs)

        return replayed
    methods = {attr for attr, fn in vars(real).items() if callable(fn) and not attr.startswith("_")}
    if hasattr(real, "forward"):
        methods.add("forward")
    body: dict[str, Any] = {}
    for attr, prop in vars(real).items():
        if isinstance(prop, property) and prop.fget is not None and not attr.startswith("_"):

            def getter(self, _fn=prop.fget, _label=f"{name}.{attr}", _sig=_signature(prop.fget)):  # noqa: B008
                return replay.answer(_label, _sig, _fn, (self,), {}, skip_first=True)

            body[attr] = property(getter)
    for attr in methods:
        fn = getattr(real, attr)

        def method(self, *args, _fn=fn, _label=f"{name}.{attr}", _sig=_signature(fn), **kwargs):  # noqa: B008
            return replay.answer(_label, _sig, _fn, (self, *args), kwargs, skip_first=True)

        body[attr] = method
    return type(real.__name__, (real,), body)


def _run(case: Case, namespace: dict) -> tuple[dict, dict, str | None]:
    """Follow the case's steps here, with the reference namespace: (meta, leaves, error)."""
    from decoder_course.harvest import _Runner

    runner = _Runner(namespace, case.arrays)
    error = None
    try:
        with contextlib.redirect_stdout(None), contextlib.redirect_stderr(None):
            for step in case.steps:
                runner.step(step)
    except Exception as exc:  # noqa: BLE001 - the reference may raise where the case expects it
        error = f"{type(exc).__name__}: {exc}"
    return runner.meta, runner.leaves, error


def _rng_kept():
    try:
        import torch
    except ImportError:
        return contextlib.nullcontext()
    return torch.random.fork_rng()


def judge(ex, result: Result, passed: dict[str, bool] | None = None) -> None:
    """Judge ``ex`` (which declares ``uses`` and ``reference``) so that the student's other items cannot change
    its verdict.

    When every building block is an item of the notebook that passed its own checks (``passed``), the student's
    pieces are right: the exercise's own checks decide, as for any item. The replay is for the other case: it
    cannot tell a wrong building block from a right one fed a different state by this item (a beam search that
    never reorders its cache feeds the cache what the student's code gave it), so it only decides when a
    building block is known to be wrong, or is not an item of this notebook."""
    if passed is not None and all(passed.get(name) for name in ex.uses):
        ex.judge(result)
        return
    module: ModuleType = ex.reference
    names = [name for name in ex.uses if hasattr(module, name)]
    replays: dict[str, tuple[_Replay, dict, dict, str | None]] = {}
    for case in result.cases.values():
        replay = _Replay(_recorded_calls(result, case.id), ex.required_calls)
        if not replay.calls or not case.relative:
            continue  # the student's code used none of them here (or the case has no values to replay)
        stand_ins = {name: _replayer(replay, name, getattr(module, name)) for name in names}
        namespace = {**vars(module), **stand_ins}
        with contextlib.ExitStack() as stack:
            stack.enter_context(_rng_kept())
            for name, stand_in in stand_ins.items():
                stack.enter_context(mock.patch.object(module, name, stand_in))
            meta, leaves, error = _run(case, namespace)
        replays[case.id] = (replay, meta, leaves, error)
    for case_id, (replay, *_) in replays.items():
        if replay.missing:  # a call that passes state on (a cache's reorder): answers alone cannot show it
            raise Fail(f"{ex.required_message} "
                       f"({result.cases[case_id].desc}).")
    differs = sorted({label.split(".")[0] for replay, *_ in replays.values() for label in replay.differs})
    if not differs:
        ex.judge(result)  # their building blocks answered as the reference's would: the usual checks decide
        return
    own = " and ".join(f"`{name}`" for name in differs)
    seen = 0  # cases on which something of this item's own code could be observed
    for case in result.cases.values():
        if case.id not in replays:
            continue
        error = replays[case.id][3]
        if error is not None and error.startswith(_DependencyRaised.__name__):
            continue  # it stopped inside a building block of the student's that raised: nothing of its own to see
        _consistent(result, case, *replays[case.id][1:], own)
        seen += 1
    rest = [case for case in result.cases.values() if case.id not in replays]
    if rest:
        seen += _judged_alone(ex, result, rest)
    if not seen:
        stopped = sorted({replays[cid][3].split(": ", 1)[-1].split(".")[0] for cid in replays})
        names = " and ".join(f"`{name}`" for name in stopped) or own
        below = [name for name in differs if name not in stopped]
        built = (f" (built on your own {' and '.join(f'`{name}`' for name in below)}, whose answers differ from a "
                 "correct one's)") if below else ""
        raise Unobservable(f"nothing of this cell could be checked: on every hidden case your code stops inside your "
                           f"own {names}, which raised where a correct one returns{built}. Fix that first (see its "
                           "cell's verdict): then this cell is judged on what it does with it.")


def _judged_alone(ex, result: Result, cases: list[Case]) -> int:
    """Judge the cases that called none of the building blocks (or have no values to replay) by the exercise's own
    checks, as cases of their own; how many were judged (0 when its checks need the other cases too)."""
    alone = copy.copy(result)
    alone.cases = {case.id: case for case in cases}
    try:
        ex.judge(alone)
    except Fail:
        raise
    except Exception:  # noqa: BLE001 - its checks read a case that is not in this subset: they cannot judge it
        return 0
    return len(cases)


def _consistent(result: Result, case: Case, meta: dict, leaves: dict, error: str | None, own: str) -> None:
    """The student's outputs on this case must be the replay's: the reference built on their own pieces."""
    why = (f"(judged with your own {own} as they answered here: their mistakes cost their own cells, not this "
           "one)")
    student_error = result.error(case.id)
    if student_error is not None and error is None:
        raise Raised(f"your code raised an exception on a case with {case.desc}, although built on your own {own} "
                   f"it should not:\n    {student_error.splitlines()[-1]}")
    if error is not None and student_error is None:
        raise Fail(f"built on your own {own}, this case ({case.desc}) should end in an exception, but your code "
                   f"returned {why}.")
    got_meta = result.report_cases.get(case.id, {}).get("outputs", {})
    for name, info in meta.items():
        if name.startswith(("~", "grad", "ptr")):
            continue  # gradients flow through the student's own pieces (the replay cannot follow); addresses
        got = got_meta.get(name) if isinstance(got_meta, dict) else None
        if not isinstance(got, dict) or got.get("type") != info.get("type"):
            found = got.get("type") if isinstance(got, dict) else "nothing"
            raise Fail(f"`{name}` should be {info.get('type')}, got {found} on a case with {case.desc} {why}.")
        if name not in leaves:
            continue
        want = leaves[name]
        have = result.leaves.get(f"{case.id}/{name}")
        if have is None or have.shape != want.shape:
            shape = None if have is None else have.shape
            raise Fail(f"`{name}` should have shape {want.shape}, got {shape} on a case with {case.desc} {why}.")
        if not _same(want, have):
            diff = np.abs(have.astype(np.float64) - want.astype(np.float64))
            where = np.argwhere(~np.isclose(have.astype(np.float64), want.astype(np.float64), rtol=_RTOL,
                                            atol=_ATOL, equal_nan=True))
            first = where[0].tolist() if where.size else []
            raise Fail(f"`{name}` is wrong on a case with {case.desc}: max abs error {np.nanmax(diff):.3g}, first "
                       f"at index {first} {why}. Fix those first if their checks fail, then look at this one's "
                       "own steps.")
