"""torch.compile support for the C engine, with no cost when torch is not compiling.

torch.compile's tracer (dynamo) reads Python bytecode and cannot look inside
a C function, so a compiled function that calls ``pk.flatten`` would stop at
``_speedups.flatten``. Dynamo can be told to trace a Python function in a C
function's place (``torch.compiler.substitute_in_graph``); the pure engine,
which gives the same results by definition, is that function. Eager calls
still go straight to C.

Registering needs ``torch._dynamo``, which takes seconds to import, so it is
never imported here. If it is already imported, the substitutes are
registered at once; otherwise a one-shot import hook registers them just
after ``torch._dynamo`` finishes importing (which torch.compile and
torch.export do before they trace anything), and then removes itself. The
hook looks at one module name per import and loads nothing. Nothing here
changes what any function returns.

The public functions are ``_speedups.FastCall`` objects, which
``_engine.c_fast_call`` marks so that dynamo traces the def each one wraps.

Registering also tells ``_tracer`` what the installed torch's tracer can
follow, which the pure engine's traced steps (``_traced``) read.

:func:`install` is called once, explicitly, by ``pytree_kit/__init__.py``
(so that ``torch.compile`` of a function that calls ``pk.flatten`` works
whether or not ``pytree_kit.torch`` is imported). This module is below
``_engine``: it imports only the pure engine and ``_tracer``, and is handed
the C engine.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import warnings
from typing import Any

from . import _interface, _pure, _tracer

_DYNAMO = "torch._dynamo"
#: the operations dynamo is given the pure engine's function for (``@traced``)
_NAMES = _interface.TRACED
_lock = threading.Lock()
_registered = False
#: what install() was given: the C engine, or None
_c_engine: Any = None


def register() -> bool:
    """Tell the pure engine when dynamo traces it, and register it as
    dynamo's stand-in for each C function.

    Idempotent; returns whether the substitutes are registered (False when
    this torch has no ``torch.compiler.substitute_in_graph``, or when
    :func:`install` was given no C engine).
    """
    global _registered
    with _lock:
        if _registered:
            return True
        _tell_pure_engine()
        if _c_engine is None:
            return False
        try:
            from torch.compiler import substitute_in_graph
        except ImportError:  # torch older than 2.5
            return False
        try:
            for name in _NAMES:
                substitute_in_graph(getattr(_c_engine, name), skip_signature_check=True)(
                    getattr(_pure, name)
                )
        except Exception as e:  # never break torch's own import over this
            warnings.warn(
                f"pytree_kit: torch.compile cannot trace the C engine ({e}); "
                "set PYTREE_KIT_PURE=1 to compile code that calls pytree_kit",
                RuntimeWarning,
                stacklevel=2,
            )
            return False
        _registered = True
        return True


#: the oldest torch whose torch.compile traces pytree_kit (docs/compatibility.md)
OLDEST_TORCH = (2, 9)
#: the first torch whose dynamo reads an instance's ``__dict__`` (its keys,
#: values and length) while tracing
_READS_INSTANCE_DICTS = (2, 12)
#: the first torch whose dynamo reads and compares containers' ids
_READS_IDENTITY = (2, 13)


def torch_version(text: str) -> tuple:
    """``(major, minor)`` of a torch version string.

    Examples:
        >>> torch_version("2.9.1+cu128"), torch_version("2.15.0a0+git1234")
        ((2, 9), (2, 15))
    """
    parts = text.split("+")[0].split(".")
    return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)


def _tell_pure_engine() -> None:
    """What the pure engine must know of the tracer: how to tell that it is
    tracing, whether it can read instances' ``__dict__``, and which of its
    functions the tracer runs as they are and takes the result of as a
    constant (facts about a class alone)."""
    import torch

    version = torch_version(torch.__version__)
    if version < OLDEST_TORCH:
        warnings.warn(
            f"pytree_kit: torch {torch.__version__} is older than "
            f"{'.'.join(map(str, OLDEST_TORCH))}, the oldest torch that torch.compile "
            "traces pytree_kit on; compiled code that calls pytree_kit may fail to trace "
            "(supported: torch 2.9 to 2.15, docs/compatibility.md)",
            RuntimeWarning,
            stacklevel=3,
        )
    try:
        from torch.compiler import assume_constant_result, is_compiling
    except ImportError:  # torch older than 2.3: traced walks check cycles on entry
        return
    _tracer.learn(
        is_compiling,
        instance_dicts=version >= _READS_INSTANCE_DICTS,
        identity=version >= _READS_IDENTITY,
    )
    for fact in _pure.CLASS_FACTS:
        assume_constant_result(fact)


class _Loader:
    """Runs the real loader of ``torch._dynamo``, then :func:`register`."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        # Put the real loader back where importlib recorded this one.
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        register()

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self._loader, name)


class _Finder:
    """A meta-path finder that answers for ``torch._dynamo`` only, once."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != _DYNAMO:
            return None
        uninstall()
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)  # type: ignore[assignment]
        return spec


_finder = _Finder()


def uninstall() -> None:
    """Remove the import hook (it also removes itself when it fires)."""
    with _lock:
        while _finder in sys.meta_path:
            sys.meta_path.remove(_finder)


def install(engine: Any) -> None:
    """Register now if ``torch._dynamo`` is imported, else when it is.

    ``engine`` is the C engine, whose functions get the pure engine's as
    stand-ins, or None when the pure engine runs (``_tracer`` is then only
    told what the tracer can follow). ``pytree_kit/__init__.py`` calls this
    once.
    """
    global _c_engine
    _c_engine = engine
    if _DYNAMO in sys.modules:
        register()
    elif _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
