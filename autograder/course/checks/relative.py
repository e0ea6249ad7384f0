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
import dataclasses
import inspect
import sys
from types import ModuleType
from typing import Any
from unittest import mock

import numpy as np

from autograder.course.checks.framework import Case, Fail, Raised, Result, Unobservable

_OPAQUE = object()  # a recorded value that was described, not handed back (a model, a cache)
_RTOL, _ATOL = 1e-4, 1e-5  # an item's outputs against the replay's (its own float32 arithmetic may differ)
# A building block's answer against a correct one's on the same arguments: as strict as the items' own value checks
# (rtol 1e-5), so that a block just wrong enough to fail its own cell (label smoothing over V - 1 tokens moves a loss
# by 1e-4) is never taken for right, which would leave the item built on it judged, and failed, by its own checks.
_BLOCK_RTOL, _BLOCK_ATOL = 1e-5, 1e-6
_MAX_ANSWERS = 256  # answers sent for one case at most (see ``answered``)


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
    def __init__(self, args: list, kwargs: dict, out: Any, returned: bool, after: list, answered: bool = False):
        self.args, self.kwargs, self.out, self.returned, self.after = args, kwargs, out, returned, after
        self.answered = answered  # a correct building block's answer stood in for the student's (``answered``)


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
                                                 list(after) if isinstance(after, list) else args,
                                                 answered=f"{prefix}/answered" in meta))
    return calls  # each label's calls in call order (the report keeps the kernel's order)


def arguments_of(result: Result, case_id: str, label: str) -> list[tuple[list, dict]]:
    """The arguments (positional, by name) of each recorded call of the student's ``label`` on a case, in call
    order: what an item handed its building block, for a check of what its docstring promises about that."""
    return [(call.args, call.kwargs) for call in _recorded_calls(result, case_id).get(label, [])]


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


def _same(a: Any, b: Any, rtol: float = _RTOL, atol: float = _ATOL) -> bool:
    """Recorded ``b`` agrees with ``a`` (opaque parts of ``b`` agree with anything)."""
    if b is _OPAQUE:
        return True
    x, y = _as_array(a), _as_array(b)
    if x is not None or y is not None:
        if x is None or y is None or x.shape != y.shape:
            return False
        if (x.dtype.kind in "fc") != (y.dtype.kind in "fc"):
            return False  # float ids where ints are due (or the reverse): what the caller does with them differs
        if x.dtype.kind in "fc" or y.dtype.kind in "fc":
            return bool(np.allclose(x.astype(np.float64), y.astype(np.float64), rtol=rtol, atol=atol,
                                    equal_nan=True))
        return bool(np.array_equal(x, y))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(p, q, rtol, atol) for p, q in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], rtol, atol) for k in a)
    if a is None or b is None:
        return a is b
    if isinstance(a, (bool, int, float)) and isinstance(b, (bool, int, float)):
        return bool(np.isclose(float(a), float(b), rtol=rtol, atol=atol, equal_nan=True))
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
    def __init__(self, calls: dict[str, list[_Call]], required: tuple[str, ...] = (), answering: bool = False):
        self.calls = calls
        self.differs: set[str] = set()  # labels whose answers (or changes to their arguments) are not a correct one's
        self.answered: set[str] = set()  # labels with calls a correct one's answer stood in for (``answered``)
        self.required = set(required)  # labels the student's code must call as the reference does
        self.missing: list[str] = []
        # answering: follow a correct exercise on correct building blocks (the reference's, none of the student's
        # answers inside), and keep a correct one's answer to each of the student's calls that raised or answered
        # wrong, on the student's own arguments: see ``answered``
        self.answering = answering
        # each kept answer: (label, the arguments to send, the keywords to send, the answer, and the arguments and
        # keywords it was computed on: an answer that hands back one of them is sent as that argument)
        self.kept: list[tuple[str, list, dict, Any, list, dict]] = []
        self._pure = 0  # inside a correct building block's own answer: every call is the reference's
        self._count: dict[str, int] = {}  # the replay's calls of each label so far
        self._module_copies: dict[int, tuple] = {}  # id(module) -> (module, its copy, both stamps): see _copied

    def answer(self, label: str, signature: inspect.Signature | None, real_fn, args: tuple, kwargs: dict,
               skip_first: bool = False):
        if self._pure:
            return real_fn(*args, **kwargs)
        if self.answering:
            index = self._count.get(label, 0)
            self._count[label] = index + 1
            made = self.calls.get(label, [])
            if index < len(made):
                self._keep_students(label, made[index], real_fn, args, kwargs, skip_first)
            # the replay itself goes on as a correct item on correct building blocks: the state of the objects
            # the student's calls are answered on is a correct one's
            return self._correct(real_fn, args, kwargs)  # one that raises here is what the case expects
        call = self._find(label, signature, args, kwargs, skip_first)
        if call is not None and call.answered:  # a correct one's answer stood in for the student's
            self.answered.add(label)
            try:  # the reference's own state (a cache's) goes on as the student's object was told it did
                real = real_fn(*args, **kwargs)
            except Exception:  # noqa: BLE001 - built on the student's wrong answers, it may raise: the answer stands
                return _merge(call.out, None)
            return _straight_through(_merge(call.out, real), real)
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
        if not _same(real, call.out, _BLOCK_RTOL, _BLOCK_ATOL):
            self.differs.add(label)
        given = args[1:] if skip_first else args
        for arg, before, after in zip(given, call.args, call.after, strict=False):
            if not _same(before, after):  # the student's changed its argument in place: so does the replay
                self.differs.add(label)
                _write(arg, after)
        return _straight_through(_merge(call.out, real), real)

    def _correct(self, real_fn, args, kwargs):
        """A correct building block's answer: the reference's, with none of the student's answers inside it."""
        self._pure += 1
        try:
            return real_fn(*args, **kwargs)
        finally:
            self._pure -= 1

    def _keep(self, *answer) -> None:
        if len(self.kept) < _MAX_ANSWERS:
            self.kept.append(answer)

    def _keep_students(self, label: str, made: _Call, real_fn, args: tuple, kwargs: dict, skip_first: bool) -> None:
        """The student's call of ``label`` paired with this one (the same count): where it raised, or answered
        otherwise than a correct one, keep a correct one's answer on the student's own arguments (their objects,
        which were not handed back, are this call's, in a correct state: a copy, so that the replay's own state
        goes on untouched). Only the student's own arguments are answered: the answers show nothing of how a
        correct item would have called its building blocks."""
        given = list(args[1:] if skip_first else args)
        head = list(args[:1]) if skip_first else []
        if any(arg is _OPAQUE and i >= len(given) for i, arg in enumerate(made.args)) or any(
                value is _OPAQUE and key not in kwargs for key, value in made.kwargs.items()):
            return  # an object this call does not pass: nothing to compute the answer on
        call_args = [given[i] if arg is _OPAQUE else arg for i, arg in enumerate(made.args)]
        call_kwargs = {key: kwargs[key] if value is _OPAQUE else value for key, value in made.kwargs.items()}
        try:
            head, call_args, call_kwargs = self._copied(head, call_args, call_kwargs)
            value = self._correct(real_fn, (*head, *call_args), call_kwargs)
        except Exception:  # noqa: BLE001 - a correct one raises on these arguments too (or they cannot be copied)
            return
        if made.returned and not made.answered and _same(value, made.out, _BLOCK_RTOL, _BLOCK_ATOL):
            return  # the student's answered as a correct one does: it stays theirs
        self._keep(label, list(made.args), dict(made.kwargs), value, call_args, call_kwargs)

    def _copied(self, head: list, args: list, kwargs: dict) -> tuple[list, list, dict]:
        """A deep copy of a call's arguments for a correct building block to work on. A module passed as an
        argument (a model, a layer: the same object at every step of a decoding loop) is copied once per replay
        and its copy handed to later calls, as long as neither it nor its copy has changed since (the same tensors
        with the same values, the same training flags and attributes): a correct block that changed the copy gets
        a new one.
        Deep-copying the model at every step was two thirds of the time spent answering a decoding loop."""
        memo: dict[int, Any] = {}
        direct = [*head, *args, *kwargs.values()]
        for obj in direct:
            kept = self._module_copies.get(id(obj))
            if (kept is not None and kept[0] is obj and _same_stamp(kept[2], _stamp(obj))
                    and _same_stamp(kept[3], _stamp(kept[1]))):
                memo[id(obj)] = kept[1]
        copied = copy.deepcopy((head, args, kwargs), memo)
        for obj in direct:
            if _is_module(obj) and id(obj) in memo:
                twin = memo[id(obj)]
                self._module_copies[id(obj)] = (obj, twin, _stamp(obj), _stamp(twin))
        return copied

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


def _is_module(obj) -> bool:
    torch = sys.modules.get("torch")  # a module can only exist if torch was imported
    return torch is not None and isinstance(obj, torch.nn.Module)


def _stamp(module) -> tuple:
    """What a correct block could change of a module: each tensor's identity and values (a copy of them: an
    inference tensor keeps no version counter), each submodule's training flag and attribute names."""
    if not _is_module(module):
        return ()
    named = (*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False))
    return (tuple((name, id(t)) for name, t in named), tuple(t.detach().clone() for _, t in named),
            tuple((m.training, tuple(m.__dict__)) for m in module.modules()))


def _same_stamp(a: tuple, b: tuple) -> bool:
    torch = sys.modules["torch"]  # stamps of modules only
    return (len(a) == len(b) == 3 and a[0] == b[0] and a[2] == b[2]
            and all(torch.equal(x, y) for x, y in zip(a[1], b[1])))


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
            for step in case.steps:  # the answers sent to the kernel are not the replay's: it has its own
                runner.step({key: value for key, value in step.items() if key != "answers"})
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
        ex.judge(result)  # right building blocks: the item's own checks, which say what broke, decide first
        if ex.required_calls:
            # ... and a call that passes state on must still be made: a wrong one can leave every output right on
            # some inputs (a cache reordered by beam index alone is right for batch row 0 and may not show)
            for case in result.cases.values():
                replay = _Replay(_recorded_calls(result, case.id), ex.required_calls)
                if replay.calls and case.relative:
                    _replayed(ex, case, replay)
                    if replay.missing:
                        raise Fail(f"{ex.required_message} ({case.desc}).")
        return
    replays: dict[str, tuple[_Replay, dict, dict, str | None]] = {}
    for case in result.cases.values():
        replay = _Replay(_recorded_calls(result, case.id), ex.required_calls)
        if not replay.calls or not case.relative:
            continue  # the student's code used none of them here (or the case has no values to replay)
        replays[case.id] = (replay, *_replayed(ex, case, replay))
    for case_id, (replay, *_) in replays.items():
        if replay.missing:  # a call that passes state on (a cache's reorder): answers alone cannot show it
            raise Fail(f"{ex.required_message} "
                       f"({result.cases[case_id].desc}).")
    def blocks(labels) -> list[str]:
        return sorted({label.split(".")[0] for label in labels})

    differs = blocks(label for replay, *_ in replays.values() for label in replay.differs)
    stood_in = blocks(label for replay, *_ in replays.values() for label in replay.answered)
    if not differs and not stood_in:
        ex.judge(result)  # their building blocks answered as the reference's would: the usual checks decide
        return
    said = " and ".join(f"`{name}`" for name in differs)
    why = (f"judged with your own {said} as they answered here" if differs else "judged") + (
        f"{', and' if differs else ''} with a correct one's answers where your "
        f"{' and '.join(f'`{name}`' for name in stood_in)} raised or went wrong" if stood_in else "")
    why = f"({why}: their mistakes cost their own cells, not this one)"
    if not differs:
        # every building block it called answered right, or had a correct one's answer stand in: its outputs
        # are those of correct building blocks, and its own checks, which say what broke, decide. Where they fail
        # on what answers cannot carry (a gradient through a value handed back), consistency has the last word.
        try:
            ex.judge(result)
            return
        except Fail as own_checks:
            try:
                _judge_consistency(ex, result, replays, stood_in, why, strict=True)
            except Fail:
                raise own_checks from None
            return
    _judge_consistency(ex, result, replays, differs, why)


def _judge_consistency(ex, result: Result, replays: dict, differs: list[str], why: str, strict: bool = False) -> None:
    """Every case that shows something of the item's own code must agree with its replay. ``strict``: a case the
    replay cannot follow to its end fails, where the student's code returned on it (it may be the one that shows
    the mistake)."""
    seen = 0  # cases on which something of this item's own code could be observed
    for case in result.cases.values():
        if case.id not in replays:
            continue
        error = replays[case.id][3]
        if error is not None and error.startswith(_DependencyRaised.__name__):
            if strict and result.error(case.id) is None:
                raise Fail(f"this case ({case.desc}) could not be followed {why}.")
            continue  # it stopped inside a building block of the student's that raised: nothing of its own to see
        _consistent(result, case, *replays[case.id][1:], why)
        seen += 1
    rest = [case for case in result.cases.values() if case.id not in replays]
    if rest:
        seen += _judged_alone(ex, result, rest)
    if not seen:
        stopped = sorted({replays[cid][3].split(": ", 1)[-1].split(".")[0] for cid in replays})
        names = " and ".join(f"`{name}`" for name in stopped) or " and ".join(f"`{name}`" for name in differs)
        below = [name for name in differs if name not in stopped]
        built = (f" (built on your own {' and '.join(f'`{name}`' for name in below)}, whose answers differ from a "
                 "correct one's)") if below else ""
        raise Unobservable(f"nothing of this cell could be checked: on every hidden case your code stops inside your "
                           f"own {names}, which raised where a correct one returns{built}. Fix that first (see its "
                           "cell's verdict): then this cell is judged on what it does with it.")


def _replayed(ex, case: Case, replay: _Replay) -> tuple[dict, dict, str | None]:
    """Follow ``case`` with the reference's code, the student's building blocks answered by ``replay``."""
    module: ModuleType = ex.reference
    names = [name for name in ex.uses if hasattr(module, name)]
    stand_ins = {name: _replayer(replay, name, getattr(module, name)) for name in names}
    namespace = {**vars(module), **stand_ins}
    with contextlib.ExitStack() as stack:
        stack.enter_context(_rng_kept())
        for name, stand_in in stand_ins.items():
            stack.enter_context(mock.patch.object(module, name, stand_in))
        return _run(case, namespace)


def answered(ex, result: Result) -> list[Case] | None:
    """The cases of ``ex`` to run once more, or None: where one of the building blocks raised on a case (the
    student's wrong one, or a right one fed a wrong one's output), that case with a correct building block's
    answers to the student's own calls, so that the student's code runs on and is judged by itself.

    A building block that raises stops the item built on it: nothing of the item could be seen, and it would lose
    its point for a mistake that is not its own. So the case is followed here by the reference's code on correct
    building blocks, each of its calls paired with the student's call of the same name and count; where the
    student's raised, or answered otherwise than a correct one would on the same arguments, a correct one's answer
    on the student's own arguments is kept. Sent with the case (harvest's spy step), each stands in for that very
    call. The next run goes further (a decoding loop on a wrong cache: a step or more per run), up to
    ``verdicts.ANSWER_ROUNDS`` runs; a run that would answer nothing new is not made.

    Only the student's own arguments are answered, so the answers show nothing of how a correct item calls its
    building blocks, nor anything of its result: they are what a correct building block would hand the student's
    code, and the item's grade still rests on that code. They cannot raise the building block's own grade either
    (its cell is judged on cases of its own)."""
    again: list[Case] = []
    sent = False
    for case in result.cases.values():
        calls = _recorded_calls(result, case.id)
        # stopped: a building block raised, or the item raised after its building blocks returned (on a wrong
        # one's answer, e.g. float ids handed to an embedding): either way a correct one's answers may let it run on
        stopped = any(not call.returned for made in calls.values() for call in made) or (
            bool(calls) and result.error(case.id) is not None)
        if not stopped or not case.relative:
            again.append(case)
            continue
        replay = _Replay(calls, ex.required_calls, answering=True)
        _replayed(ex, case, replay)
        answers: dict[str, list] = {}
        twin = dataclasses.replace(case, steps=copy.deepcopy(case.steps), arrays=dict(case.arrays))
        for label, args, kwargs, out, on_args, on_kwargs in replay.kept:
            own = {id(arg): {"argument": i} for i, arg in enumerate(on_args) if not _plain_value(arg)}
            own.update({id(arg): {"keyword": key} for key, arg in on_kwargs.items() if not _plain_value(arg)})
            try:
                answer = {"args": [_encode(twin, arg, loose=True) for arg in args],
                          "kwargs": {str(k): _encode(twin, v, loose=True) for k, v in kwargs.items()},
                          "out": _encode(twin, out, own=own)}
            except _Unencodable:
                continue  # an object (a model, a cache) cannot be sent: that call stays the student's
            answers.setdefault(label, []).append(answer)
        spy = next((step for step in twin.steps if "spy" in step), None)
        before = sum(len(given) for given in (spy or {}).get("answers", {}).values())
        if spy is None or sum(len(given) for given in answers.values()) <= before:
            again.append(case)  # nothing new to answer with: another run would stop where this one did
            continue
        spy["answers"] = answers
        again.append(twin)
        sent = True
    return again if sent else None


class _Unencodable(Exception):
    pass


def _plain_value(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str, np.ndarray, np.generic)) or (
        hasattr(value, "detach") and hasattr(value, "dtype"))


def _encode(case: Case, value: Any, loose: bool = False, own: dict | None = None) -> Any:
    """``value`` as a harvest VALUE (its arrays added to ``case``); an object matches anything when ``loose``,
    and is the call's own argument where ``own`` (``id`` -> its place) says it is one."""
    if own and id(value) in own:
        return own[id(value)]
    if hasattr(value, "detach") and hasattr(value, "dtype"):
        tensor = value.detach().cpu()
        dtype = str(tensor.dtype).removeprefix("torch.")
        return case.tensor(tensor.float() if dtype == "bfloat16" else tensor, dtype=dtype)
    if isinstance(value, np.ndarray) and value.dtype != object:
        return case.array(value)
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        items = [_encode(case, item, loose, own) for item in value]
        return {"tuple": items} if isinstance(value, tuple) else {"list": items}
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {"dict": {key: _encode(case, item, loose, own) for key, item in value.items()}}
    if loose:
        return {"anything": True}
    raise _Unencodable(type(value).__name__)


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


def _consistent(result: Result, case: Case, meta: dict, leaves: dict, error: str | None, why: str) -> None:
    """The student's outputs on this case must be the replay's: the reference built on their own pieces."""
    student_error = result.error(case.id)
    if student_error is not None and error is None:
        raise Raised(f"your code raised an exception on a case with {case.desc}, where it should not {why}:\n"
                     f"    {student_error.splitlines()[-1]}")
    if error is not None and student_error is None:
        raise Fail(f"this case ({case.desc}) should end in an exception, but your code returned {why}.")
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
