"""The run-time policy: while a restricted item's hidden cases run, what it must be written without cannot be used.

An exercise that asks you to write X lists PyTorch's X among its rules (``"F.scaled_dot_product_attention"``,
``"nn.MultiheadAttention"``), and a NumPy-only one a whole library (``"torch."``). The grader reads the source for
them too (its policy module: a warning in the message, which never decides); this module is what decides, from what
ran, however the code got there: a name built at run time, a lookup through another module or this package, a binding
made in an earlier cell, a file written and imported, an input transformer. The rules travel with the item's cases
as plain data (they are public: the exercise's docstring states them), and the forked child that runs the cases
(``decoder_course.harvest``) installs a :class:`Guard` before any of the student's code runs on them:

1. every reference to a forbidden function or class that the child can find (module attributes in ``sys.modules``,
   the notebook's namespace, the cells and defaults of its functions, its classes' attributes, its lists and dicts)
   is replaced by a stand-in that reports the rule;
2. the backstop, whatever the path to the object: a profile function (``sys.setprofile``, every thread) reports a
   call of a forbidden C function (by identity), of a Python function or method of a forbidden class (by its code
   object: a subclass's ``super().__init__`` included), and, for a library rule, any call that enters the library
   from outside it (its functions, its tensors' methods, ``np.asarray(tensor)``, importing it);
3. what decides wherever the call comes from: PyTorch's dispatcher. Every operator runs through it, from any
   thread (one started before the guard was armed, by an ``os.register_at_fork`` hook, too), TorchScript,
   ``torch._C._jit_get_operation``, ``torch.ops`` and C++ callers, so a kernel registered there (``torch.library``,
   for the whole process: the child exits after the item's cases) refuses a forbidden operator (the fused ones:
   ``aten::scaled_dot_product_attention`` and the ``_scaled_dot_product_*`` kernels it picks,
   ``aten::_native_multi_head_attention``; ``bmm``, ``softmax`` and ``matmul`` stay free) and, for a NumPy-only
   item, every operator at all (a torch imported during the cases is armed as its import ends);
4. a forbidden Python function (``F.multi_head_attention_forward``, which computes with ``bmm`` and ``softmax``; a
   forbidden class's own methods) gets a code object that reports: every reference to it, from any thread, runs it.

A report is final: the child sends it to the kernel and exits at once, so catching an exception cannot hide it, and
the trusted grader fails the item with the policy's message. Turning the profile function off (``sys.setprofile``
with anything else), or starting a program that would run without it, is reported the same way. The guard runs no
code of the student's and decides nothing; code of the student's that takes the grader's own objects apart in the
kernel (replacing ``collect``) is outside what a guard in the kernel can hold.
"""

from __future__ import annotations

import _thread
import contextlib
import functools
import importlib
import importlib.abc
import importlib.util
import inspect
import os
import sys
import sysconfig
import threading
import types
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["TAMPER", "Guard", "Rule", "parse_rule", "watching"]

SHORT = {"F": "torch.nn.functional", "nn": "torch.nn"}  # the short names the checks write rules with
# Where a rule that is a bare name (``"rms_norm"``) is looked for: the places PyTorch publishes its functions.
BARE_HOMES = ("torch.nn.functional", "torch", "torch.nn")
# The rule reported when the profile function is turned off, or a thread or a program is started around it.
TAMPER = "sys.setprofile"


@dataclass(frozen=True)
class Rule:
    text: str  # as the check wrote it, for the message
    root: str  # the library: "torch", "einops"
    leaf: str | None  # the function or class; None: the whole library
    path: str = ""  # the full dotted name: "torch.nn.functional.scaled_dot_product_attention"

    def matches(self, qualified: str) -> bool:
        parts = qualified.split(".")
        if parts[0] != self.root:
            return False
        return self.leaf is None or self.leaf in parts[1:]


def parse_rule(text: str) -> Rule:
    name = text.rstrip(".")
    head, _, rest = name.partition(".")
    if head in SHORT:
        name = SHORT[head] + ("." + rest if rest else "")
    parts = name.split(".")
    if text.endswith(".") or len(parts) == 1:
        return Rule(text, parts[0], None, name)
    return Rule(text, parts[0], parts[-1], name)


def _folders(*places: str) -> tuple[str, ...]:
    """Folders as prefixes of the file names code objects carry: as given and as their real paths."""
    return tuple({os.path.join(path, "") for place in places if place for path in (place, os.path.realpath(place))})


# Code that is read-only in the sandbox: the Python installation's libraries and this package. An import of one of
# them may touch another library (its module body runs whoever imported it); the student's files are not here.
_INSTALLED = _folders(*(sysconfig.get_paths().get(key, "") for key in ("stdlib", "platstdlib", "purelib", "platlib")),
                      os.path.dirname(os.path.abspath(__file__)))


def _resolve(path: str) -> Any:
    """The object a dotted name stands for (its longest module prefix imported), or None."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except Exception:  # noqa: BLE001 - not a module (or a library this install lacks)
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            return None
        return obj
    return None


def _library(root: str) -> tuple[str, ...] | None:
    """The folders (or the file) a library's code lives in, found without importing it; None when it is no
    library (``"rms_norm"``: a bare name)."""
    try:
        spec = importlib.util.find_spec(root)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    places = list(spec.submodule_search_locations or ())
    if places:
        return _folders(*places)
    if spec.origin and os.path.isabs(spec.origin):
        return tuple({spec.origin, os.path.realpath(spec.origin)})
    return None


def _functions(obj: Any) -> list[types.FunctionType]:
    """A Python function (and the one it wraps), or the functions a class defines itself (never inherited ones:
    ``nn.MultiheadAttention``'s rule does not forbid ``nn.Module.__call__``)."""
    if isinstance(obj, type):
        found = []
        for value in vars(obj).values():
            parts = [value.fget, value.fset, value.fdel] if isinstance(value, property) else \
                [getattr(value, "__func__", value)]
            for part in parts:
                found += _functions(part) if isinstance(part, types.FunctionType) else []
        return found
    if isinstance(obj, types.FunctionType):
        unwrapped = inspect.unwrap(obj)
        return [obj] if unwrapped is obj or not isinstance(unwrapped, types.FunctionType) else [obj, unwrapped]
    return []


def _codes(obj: Any) -> list[types.CodeType]:
    """The code objects :func:`_functions` run."""
    return list(dict.fromkeys(function.__code__ for function in _functions(obj)))


# What a forbidden Python function runs once the guard is armed, whoever holds it and from whichever thread: its own
# code is replaced by this (the function object stays, so every reference to it, a partial's or another thread's,
# reaches the report). The report comes in as a keyword default: the code names nothing a caller could replace, and
# a caller that passes its own computes nothing forbidden either.
_REPORTING = compile("def forbidden(*args, _guard_report=None, **kwargs):\n    _guard_report()\n", "<guard>", "exec")
_REPORTING_CODE = next(const for const in _REPORTING.co_consts if isinstance(const, types.CodeType))


# The fused operators a forbidden class runs that no forbidden function names (nn.MultiheadAttention's fast path runs
# aten::_native_multi_head_attention; its slow path is F.multi_head_attention_forward, a rule of its own).
CLASS_KERNELS = {"MultiheadAttention": "native_multi_head_attention",
                 "TransformerEncoderLayer": "transformer_encoder_layer"}
# Where the dispatcher refuses a forbidden operator: the CPU and CUDA kernels (inference mode reaches them directly)
# and every autograd key (the alias), which an operator decomposed above the backend (SDPA) passes first.
DISPATCH_KEYS = ("CPU", "CUDA", "Autograd")
# Where it refuses every operator, for a NumPy-only item: a tensor's values are computed by a CPU kernel (one made
# from NumPy is a CPU tensor; another backend's is made from it by a CPU operator).
EVERY_OPERATOR_KEYS = ("CPU",)


def _holds(words: list[str], candidate: str) -> bool:
    """``candidate``'s words hold ``words`` in order (a subsequence: each found after the one before)."""
    rest = iter(candidate.split("_"))
    return all(word in rest for word in words)


def _words(name: str) -> list[str]:
    return [word for word in name.split("_") if word not in _UNSAID]


def _operators(name: str) -> list[str]:
    """The dispatcher's operators (``aten::_scaled_dot_product_flash_attention_for_cpu``, every overload) whose
    names hold a forbidden function's words in order, when PyTorch is loaded."""
    torch, words = sys.modules.get("torch"), _words(name)
    if torch is None or not words:
        return []
    try:
        names = torch._C._dispatch_get_all_op_names()
    except Exception:  # noqa: BLE001 - a PyTorch without the operator registry: its Python API is guarded still
        return []
    return sorted(op for op in names if op.startswith("aten::") and _holds(words, op[6:].partition(".")[0]))


# Where PyTorch publishes the C functions behind its Python API, and the words of a forbidden name that its kernels'
# names leave out (F.multi_head_attention_forward runs torch._native_multi_head_attention).
KERNEL_HOMES = ("torch", "torch._C._nn", "torch._C._special", "torch._C._linalg")
_UNSAID = {"forward", ""}


def _kernels(name: str) -> list[Any]:
    """PyTorch's other doors to what a forbidden function computes: the C functions and aten operators whose names
    hold its words in order (``torch._scaled_dot_product_flash_attention_for_cpu`` and
    ``torch.ops.aten.scaled_dot_product_attention.default`` for ``scaled_dot_product_attention``), when PyTorch is
    loaded (a student's code that imports it is judged by what it calls)."""
    words = _words(name)
    torch = sys.modules.get("torch")
    if torch is None or not words:
        return []
    found = []
    for home in filter(None, map(sys.modules.get, KERNEL_HOMES)):
        found += [getattr(home, attr) for attr in dir(home)
                  if _holds(words, attr) and isinstance(getattr(home, attr, None), types.BuiltinFunctionType)]
    try:
        aten = torch.ops.aten  # its attributes are made on first use: the registry names them all
        for attr in sorted({op[6:].partition(".")[0] for op in _operators(name)}):
            packet = getattr(aten, attr)
            found += [packet._op] + [getattr(packet, overload)._op for overload in packet.overloads()]
    except Exception:  # noqa: BLE001 - a PyTorch without the operator registry: its Python API is guarded still
        pass
    return found


def _owner(fn: Any) -> str:
    """The module a C function belongs to: its own, its bound object's type's, or its class's."""
    module = getattr(fn, "__module__", None)
    if isinstance(module, str):
        return module
    owner = getattr(fn, "__self__", None)
    if owner is None:
        owner = getattr(fn, "__objclass__", None)
    if isinstance(owner, types.ModuleType):
        return owner.__name__
    kind = owner if isinstance(owner, type) else type(owner)
    module = type.__dict__["__module__"].__get__(kind)  # never a metaclass's property
    return module if isinstance(module, str) else ""


class Guard:
    """The rules of one item, resolved to the objects they name; :meth:`install` arms them in this process.

    ``report(rule)`` is called once, at the first use of what ``rule`` forbids, and must not return (the harvest's
    child sends the rule to the kernel and exits)."""

    def __init__(self, rules: list[str], report: Callable[[str], None]):
        self.report = report
        self.builtins: dict[int, str] = {}  # id of a forbidden C function -> its rule
        self.codes: dict[types.CodeType, str] = {}  # code of a forbidden Python function or method -> its rule
        self.libraries: list[tuple[str, str]] = []  # (rule, root) of the libraries forbidden whole
        self.folders: list[tuple[str, str]] = []  # (folder, rule): where their code lives
        self.replaced: dict[int, tuple[Any, Any]] = {}  # id(original) -> (original, its stand-in)
        self.functions: dict[types.FunctionType, str] = {}  # a forbidden Python function -> its rule
        self.operators: dict[str, str] = {}  # a forbidden dispatcher operator ("aten::name.overload") -> its rule
        self.every_operator: str | None = None  # the rule that forbids every operator (torch, whole)
        self.dispatcher: list[Any] = []  # the torch.library registrations, kept: dropping one unregisters it
        for text in rules:
            rule = parse_rule(str(text))
            folders = _library(rule.root) if rule.leaf is None else None
            if folders:
                self.libraries.append((rule.text, rule.root))
                self.folders += [(folder, rule.text) for folder in folders]
                if rule.root == "torch":
                    self.every_operator = self.every_operator or rule.text
                continue
            if rule.leaf is None:
                objects = [getattr(home, rule.root) for home in map(_resolve, BARE_HOMES)
                           if home is not None and hasattr(home, rule.root)]
            else:
                objects = [_resolve(rule.path)]
            for obj in objects:
                if obj is not None and callable(obj):
                    self._forbid(obj, rule.text)
            if (rule.leaf is None or rule.root == "torch") and \
                    any(obj is not None and not isinstance(obj, type) for obj in objects):
                for kernel in _kernels(rule.leaf or rule.root):
                    self._forbid(kernel, rule.text)
                for operator in _operators(rule.leaf or rule.root):
                    self.operators.setdefault(operator, rule.text)
            if rule.root == "torch" and any(isinstance(obj, type) for obj in objects):
                for operator in _operators(CLASS_KERNELS.get(rule.leaf or "", "")):
                    self.operators.setdefault(operator, rule.text)

    def _forbid(self, obj: Any, text: str) -> None:
        codes = _codes(obj)
        for code in codes:
            self.codes.setdefault(code, text)
        for function in _functions(obj):
            self.functions.setdefault(function, text)
        if not codes and not isinstance(obj, type):
            self.builtins.setdefault(id(obj), text)
        report = self.report

        def forbidden(*args, **kwargs):
            report(text)

        forbidden.__name__ = forbidden.__qualname__ = getattr(obj, "__name__", "forbidden")
        self.replaced.setdefault(id(obj), (obj, forbidden))

    @property
    def armed(self) -> bool:
        return bool(self.builtins or self.codes or self.libraries or self.operators)

    def replace_code(self) -> None:
        """Give every forbidden Python function the reporting code (:data:`_REPORTING_CODE`), for the whole
        process: a thread the profile function does not watch (one started before it) reaches the report too
        (``F.multi_head_attention_forward`` computes with ``bmm`` and ``softmax``, which the dispatcher lets
        through). A function with a closure keeps its code: the profile function still reports it."""
        for function, rule in self.functions.items():
            if function.__closure__:
                continue
            function.__code__ = _REPORTING_CODE
            function.__defaults__ = None
            function.__kwdefaults__ = {"_guard_report": functools.partial(self.report, rule)}

    # -- the dispatcher ---------------------------------------------------------------------------------------------
    def arm_dispatcher(self) -> None:
        """Refuse the forbidden operators at PyTorch's dispatcher, for the whole process and every thread (one
        started before this call too); a NumPy-only item's rule refuses every operator. Where PyTorch is not loaded
        yet, the refusal is armed as its import ends, whichever thread imports it."""
        if not (self.operators or self.every_operator):
            return
        if "torch" not in sys.modules:
            sys.meta_path.insert(0, _ArmOnImport("torch", self._refuse_at_dispatcher))
            return
        self._refuse_at_dispatcher(importlib.import_module("torch"))  # waits for an import under way in a thread

    def _refuse_at_dispatcher(self, torch: types.ModuleType) -> None:
        refused = dict(self.operators)
        keys = {name: DISPATCH_KEYS for name in refused}
        if self.every_operator:
            every = {name: self.every_operator for name in torch._C._dispatch_get_all_op_names()
                     if any(torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
                            for key in (*EVERY_OPERATOR_KEYS, "CompositeImplicitAutograd",
                                        "CompositeExplicitAutograd"))}
            refused = {**every, **refused}
            keys = {**{name: EVERY_OPERATOR_KEYS for name in every}, **keys}
        libraries: dict[str, Any] = {}
        report = self.report
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Overriding a previously registered kernel": that is the point
            for name, rule in refused.items():
                space, _, operator = name.partition("::")
                if space not in libraries:
                    libraries[space] = torch.library.Library(space, "IMPL")

                def refuse(*args, _rule=rule, **kwargs):
                    report(_rule)

                for key in keys[name]:
                    try:
                        libraries[space].impl(operator, refuse, key)
                    except Exception:  # noqa: BLE001 - an operator this key cannot take (its others still refuse)
                        continue
        self.dispatcher += list(libraries.values())

    # -- arming -----------------------------------------------------------------------------------------------------
    def install(self, namespace: dict) -> None:
        """Replace what the rules name wherever this process can find it, and start the profile function in this
        thread and every thread started from now on. ``namespace``: the notebook's globals."""
        if not self.armed:
            return
        self.arm_dispatcher()  # first: it runs PyTorch's own code, which the profile function would report
        self.replace_code()
        original_setprofile, start_thread, report = sys.setprofile, _thread.start_new_thread, self.report
        if getattr(original_setprofile, "__self__", None) is not sys or original_setprofile.__name__ != "setprofile":
            report(TAMPER)  # replaced before the cases ran: the profile function could not be started

        def setprofile(function):
            if function is not hook:
                report(TAMPER)
            original_setprofile(hook)

        def start_new_thread(function, args, kwargs=None):
            def profiled(*a, **k):
                original_setprofile(hook)
                return function(*a, **k)

            return start_thread(profiled, args, kwargs or {})

        def getprofile():
            return None

        self.builtins.setdefault(id(start_thread), TAMPER)  # reached around its stand-in: a thread unwatched
        for program in _programs():  # a new program runs without the guard: no hidden case needs one
            self.builtins.setdefault(id(program), TAMPER)
        hook = self._hook(exempt={start_new_thread.__code__}, floor=sys._getframe(1))
        replaced = {**self.replaced, id(original_setprofile): (original_setprofile, setprofile),
                    id(start_thread): (start_thread, start_new_thread),
                    id(sys.getprofile): (sys.getprofile, getprofile)}
        for module in list(sys.modules.values()):
            variables = getattr(module, "__dict__", None) if isinstance(module, types.ModuleType) else None
            if isinstance(variables, dict):
                _swap_dict(variables, replaced)
        _swap_namespace(namespace, replaced)
        threading._profile_hook = hook  # what threading.setprofile does, without its call of sys.setprofile
        original_setprofile(hook)

    def _hook(self, exempt: set, floor: types.FrameType) -> Callable:
        """The profile function: plain lookups, since it runs on every call the student's code makes. ``exempt``:
        the guard's own code, which may call what it stands in for; ``floor``: the frame that runs the cases (the
        frames below it, the kernel's own, are not the cases')."""
        builtins, codes, report, libraries = self.builtins, self.codes, self.report, self.libraries
        prefixes = tuple(prefix for prefix, _ in self.folders)
        seen: dict[types.CodeType, str | None] = {}  # code -> the library rule its file falls under, or None

        def library(code: types.CodeType) -> str | None:
            if code not in seen:
                name = code.co_filename
                seen[code] = next((rule for prefix, rule in self.folders if name.startswith(prefix)), None) \
                    if prefixes and name.startswith(prefixes) else None
            return seen[code]

        def importing(frame) -> bool:
            """An installed library's module body runs below ``frame``: its import talks to the libraries already
            loaded (einops imports its torch support when torch is), whoever imported it."""
            while frame is not None and frame is not floor:
                if frame.f_code.co_name == "<module>" and frame.f_code.co_filename.startswith(_INSTALLED):
                    return True
                frame = frame.f_back
            return False

        def hook(frame, event, arg):
            if event == "call":
                rule = codes.get(frame.f_code)
                if rule is not None:
                    report(rule)
                elif libraries and (rule := library(frame.f_code)) is not None and \
                        (frame.f_back is None or library(frame.f_back.f_code) is None) and not importing(frame.f_back):
                    report(rule)  # entering the library from outside it
            elif event == "c_call":
                rule = builtins.get(id(arg))
                if rule is not None:
                    if rule != TAMPER or frame.f_code not in exempt:
                        report(rule)
                elif libraries and library(frame.f_code) is None:
                    try:
                        owner = _owner(arg)
                    except Exception:  # noqa: BLE001 - an object that answers nothing is no library's
                        return
                    for text, root in libraries:
                        if (owner == root or owner.startswith(root + ".")) and not importing(frame):
                            report(text)

        return hook


class _ArmOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it lets the other finders find ``root`` and arms ``arm(module)`` as the module's code
    ends, before the import returns to whoever asked (any thread)."""

    def __init__(self, root: str, arm: Callable[[types.ModuleType], None]):
        self.root, self.arm = root, arm

    def find_spec(self, name, path=None, target=None):
        if name != self.root:
            return None
        for finder in sys.meta_path:
            found = getattr(finder, "find_spec", None) if finder is not self else None
            spec = found(name, path, target) if found is not None else None
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader.exec_module = _then(spec.loader.exec_module, self.arm)  # this import's own loader
                return spec
        return None


def _then(run: Callable[[types.ModuleType], None], arm: Callable[[types.ModuleType], None]) -> Callable:
    """A loader's ``exec_module`` that arms ``arm`` on the module once its code has run."""

    def exec_module(module: types.ModuleType) -> None:
        run(module)
        arm(module)

    return exec_module


@contextlib.contextmanager
def watching(rules: list[str] | tuple[str, ...]) -> Iterator[list[str]]:
    """The rules whose forbidden functions or classes are called while the block runs, in this thread, in order:
    what a visible check uses to say in the notebook what the grader will refuse. Nothing is stopped or replaced,
    and the profile function in place before the block is put back after it (unlike :meth:`Guard.install`, which
    is for good). A rule that forbids a whole library is not watched here."""
    reached: list[str] = []
    guard = Guard(list(rules), reached.append)  # resolves the rules; installs nothing
    builtins, codes = guard.builtins, guard.codes

    def hook(frame, event, arg):
        rule = codes.get(frame.f_code) if event == "call" else builtins.get(id(arg)) if event == "c_call" else None
        if rule is not None and rule not in reached:
            reached.append(rule)

    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        yield reached
    finally:
        sys.setprofile(previous)


def _programs() -> list[Any]:
    """The C functions that start a new program (``subprocess``, ``os.system``, ``os.exec*``, spawn): it would run
    without the guard."""
    import _posixsubprocess

    names = ("system", "execv", "execve", "posix_spawn", "posix_spawnp")
    return [getattr(os, name) for name in names if hasattr(os, name)] + [_posixsubprocess.fork_exec]


def _swap_dict(variables: dict, replaced: dict) -> None:
    for key, value in list(variables.items()):
        found = replaced.get(id(value))
        if found is not None and found[0] is value:
            variables[key] = found[1]


_MAX_SWEPT = 10_000  # items of a list or dict of the namespace looked through (the profile function sees the rest)


def _swap_namespace(namespace: dict, replaced: dict) -> None:
    """The notebook's globals, and one level into what they hold: the cells and defaults of its functions (a
    binding made in a loop or a closure), its own classes' attributes, its lists and dicts."""

    def swap(value: Any) -> Any:
        found = replaced.get(id(value))
        return found[1] if found is not None and found[0] is value else value

    _swap_dict(namespace, replaced)
    for value in list(namespace.values()):
        functions = [value] if isinstance(value, types.FunctionType) else []
        if isinstance(value, type) and value.__module__ == namespace.get("__name__"):
            for name, attribute in list(vars(value).items()):
                inner = getattr(attribute, "__func__", attribute)
                if isinstance(inner, types.FunctionType):
                    functions.append(inner)
                elif swap(attribute) is not attribute:
                    setattr(value, name, swap(attribute))
        elif isinstance(value, list) and len(value) <= _MAX_SWEPT:
            value[:] = [swap(item) for item in value]
        elif isinstance(value, dict) and value is not namespace and len(value) <= _MAX_SWEPT:
            _swap_dict(value, replaced)
        for function in functions:
            for cell in function.__closure__ or ():
                try:
                    contents = cell.cell_contents
                except ValueError:  # an empty cell
                    continue
                if swap(contents) is not contents:
                    cell.cell_contents = swap(contents)
            if function.__defaults__:
                function.__defaults__ = tuple(swap(item) for item in function.__defaults__)
            if function.__kwdefaults__:
                function.__kwdefaults__ = {key: swap(item) for key, item in function.__kwdefaults__.items()}
