"""Chooses the engine: the C extension when importable, else the pure one.

Importing pytree_kit never fails because of the extension: one that is built
but does not load (an ImportError such as a missing symbol, or any exception
its init raises, as on a Python it does not know) leaves the pure engine in
charge, with a ``RuntimeWarning`` naming the error, which
``engine_info()["reason"]`` records. (CI checks that the C engine is the one
that runs where it is required.)

An install whose C build failed (no compiler: an sdist where no wheel fits)
goes on with the pure engine, and setup.py leaves a note saying why beside
the package's files (``_speedups.not-built.txt``): pip shows a build's
output only with ``-v``, so importing such an install warns, once, with that
reason and how to get the C engine. An install that never tried (another
Python implementation) does not warn.

``PYTREE_KIT_PURE=1`` in the environment forces the pure engine.
``engine_info()`` says which engine runs, why, and which of the C engine's
fast paths are on for this interpreter.

On a free-threaded CPython (PEP 703) the C engine runs with the GIL off: its
module declares that it does not need the GIL (``Py_MOD_GIL_NOT_USED``), it
reads each of the caller's containers from a snapshot taken under the
container's own lock, keeps nothing from one call to the next but class
plans (under a mutex), and ``engine_info()["gil_enabled"]`` says whether the
GIL is on. See docs/reliability.md.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import platform
import sys
import sysconfig
import warnings
from typing import Any, Callable, Optional, TypeVar

from . import _interface, _pure, _spec
from ._interface import Engine
from ._version import __version__


def wants_c(setting: Optional[str]) -> bool:
    """Whether to use the C engine, given ``PYTREE_KIT_PURE`` (None when unset).

    Examples:
        >>> wants_c(None), wants_c("1"), wants_c("0"), wants_c("")
        (True, False, True, True)
    """
    return setting in (None, "", "0")


def _fallback_warning(reason: str) -> None:
    """Say, once, that a C extension which is there did not load, and why."""
    warnings.warn(
        f"pytree_kit: {reason}; using the pure-Python engine, which gives the same "
        "results more slowly (pytree_kit.engine_info() says why)",
        RuntimeWarning,
        stacklevel=3,
    )


#: how to get the C engine, after a warning that it was not built
INSTALL_HINT = (
    "; for the C engine, install a wheel of pytree_kit, or a C compiler and Python's "
    "headers and reinstall (PYTREE_KIT_PURE=1 chooses the pure engine and silences this)"
)


def _build_failure() -> str:
    """Why the C extension failed to build, as setup.py noted it beside the
    package's files when an install went on without it; "" when no build failed
    (the extension was never built, as on another Python implementation)."""
    note = os.path.join(os.path.dirname(__file__), "_speedups.not-built.txt")
    try:
        with open(note, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""


#: the engine chosen (``_interface.Engine`` says what it provides); the
#: package calls it as ``_interface.engine``, where it is handed below
impl: Engine = _pure
#: the C engine's module where it is ``impl`` (its fast paths and FastCall), else None
c_engine: Any = None
#: why ``impl`` is the engine it is, in words (``engine_info()["reason"]``)
_reason = ""
_setting = os.environ.get("PYTREE_KIT_PURE")
if wants_c(_setting):
    try:
        _speedups = importlib.import_module("pytree_kit._speedups")
    except ModuleNotFoundError as exc:  # not built (no compiler, or not CPython)
        impl = _pure
        _not_built = _build_failure()
        if exc.name != "pytree_kit._speedups":
            _reason = f"the C extension could not be imported ({exc})"
            _fallback_warning(_reason)
        elif _not_built:
            _reason = f"the C extension was not built at install ({_not_built})"
            _fallback_warning(_reason + INSTALL_HINT)
        else:
            _reason = (
                "the C extension is not installed "
                "(it was not built: no C compiler at install time, or not CPython)"
            )
    except ImportError as exc:  # built, but it does not load here
        impl = _pure
        _reason = f"the C extension could not be imported ({exc})"
        _fallback_warning(_reason)
    except Exception as exc:  # it loads, but its init refuses this Python
        impl = _pure
        _reason = f"the C extension could not be imported ({type(exc).__name__}: {exc})"
        _fallback_warning(_reason)
    else:
        impl = c_engine = _speedups
        _reason = "the C extension is built and imported"
        if _setting == "0":
            _reason += " (PYTREE_KIT_PURE=0)"
else:
    _reason = f"PYTREE_KIT_PURE={_setting} is set"

# The one place the engine is handed to the rest of the package: every
# module reads it at call time as _interface.engine.
_interface.use(impl)
ENGINE: str = impl.NAME

#: the C engine's fast paths (a file each, pytree_kit/_fast_*.c, says what it reads;
#: _core.h on which versions)
FAST_PATH_NAMES = (
    "type_version_tags",
    "dict_reads",
    "dict_tables",
    "split_values",
    "odict_links",
)
#: the first and last CPython versions on which they were validated (as the C
#: engine's PK_VALIDATED_PYTHON; tests/test_versions.py checks the two agree)
VALIDATED_PYTHONS = ((3, 10), (3, 15))


def engine_info() -> dict[str, Any]:
    """Which engine runs pytree_kit here, why, and which fast paths are on.

    Paste it into a report about speed: the C engine reads some of CPython's
    own layouts directly, only on the versions where that was validated and
    after checking them on import; everywhere else it reads through CPython's
    public API, with the same results, more slowly.

    Keys: ``pytree_kit`` (its version), ``engine`` (``"c"`` or ``"python"``,
    as ``ENGINE``), ``reason``, ``python``, ``implementation``,
    ``free_threaded``, ``gil_enabled`` (whether the GIL is on now: always
    True but on a free-threaded build), ``validated_python`` (whether the C engine's fast paths
    were validated on this Python version), ``no_fast_paths`` (a build that
    leaves them out: ``PYTREE_KIT_NO_FAST_PATHS=1``), ``fast_paths`` (each one,
    on or off), ``plans_kept`` (whether the C engine keeps what it learnt of a
    class from one call to the next: from 3.12 through CPython's public
    ``PyUnstable_Type_AssignVersionTag``, on 3.10 and 3.11 through the
    ``type_version_tags`` fast path), ``extension`` (the C engine's file, or
    None) and ``platform``.

    Examples:
        >>> import pytree_kit as pk
        >>> info = pk.engine_info()
        >>> info["engine"] == pk.ENGINE
        True
        >>> sorted(info["fast_paths"])
        ['dict_reads', 'dict_tables', 'odict_links', 'split_values', 'type_version_tags']
    """
    c = c_engine is not None
    fast = dict(c_engine.FAST_PATHS) if c else {}
    free_threaded = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    return {
        "pytree_kit": __version__,
        "engine": ENGINE,
        "reason": _reason,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "free_threaded": free_threaded,
        "gil_enabled": bool(getattr(sys, "_is_gil_enabled", lambda: True)()),
        "validated_python": VALIDATED_PYTHONS[0] <= sys.version_info[:2] <= VALIDATED_PYTHONS[1]
        and platform.python_implementation() == "CPython"
        and not free_threaded,
        "no_fast_paths": bool(c_engine.NO_FAST_PATHS) if c else False,
        "fast_paths": {name: bool(fast.get(name, False)) for name in FAST_PATH_NAMES},
        "plans_kept": bool(getattr(c_engine, "PLANS_KEPT", False)) if c else False,
        "extension": getattr(c_engine, "__file__", None) if c else None,
        "platform": platform.platform(),
    }


F = TypeVar("F", bound=Callable[..., Any])


def call_shape(func: Callable[..., Any]) -> dict[str, Any]:
    """Which calls of ``func`` a FastCall may make itself, from its signature:
    ``npos``, the required positional arguments (the operation's operands);
    ``is_leaf``, whether ``is_leaf=`` may be given by keyword, and
    ``is_leaf_at``, its position when it may be given by position (else -1);
    ``rules``, whether ``rules=`` may be given by keyword (only ``rules=None``
    is taken). Every other call goes to ``func``. The defs are the one place
    the public signatures are written: ``_fastcall.c`` knows the operations,
    and its FastCall refuses a def whose ``npos`` its operation does not take.

    A def that a call taken in C could not agree with raises ValueError: a
    required keyword-only argument (a call taken in C would lack it), or an
    ``is_leaf`` or ``rules`` whose default is not None (the C calls give None).

    Examples:
        >>> def tree_leaves(tree, is_leaf=None): ...
        >>> call_shape(tree_leaves)
        {'npos': 1, 'is_leaf': True, 'is_leaf_at': 1, 'rules': False}
        >>> def tree_map(fn, tree, *rest, is_leaf=None, rules=None): ...
        >>> call_shape(tree_map)
        {'npos': 2, 'is_leaf': True, 'is_leaf_at': -1, 'rules': True}
    """
    P = inspect.Parameter
    params = inspect.signature(func).parameters.values()
    named = [p for p in params if p.kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD)]
    positional = [p for p in named if p.kind is not P.KEYWORD_ONLY]
    keywords = [p.name for p in named if p.kind is not P.POSITIONAL_ONLY]
    who = getattr(func, "__qualname__", repr(func))
    for p in named:
        if p.kind is P.KEYWORD_ONLY and p.default is P.empty:
            raise ValueError(
                f"{who}: a required keyword-only argument ({p.name}) has no fast calls"
            )
        if p.name in ("is_leaf", "rules") and p.default is not None:
            raise ValueError(f"{who}: {p.name} must default to None to have fast calls")
    at = [i for i, p in enumerate(positional) if p.name == "is_leaf"]
    return {
        "npos": sum(1 for p in positional if p.default is P.empty),
        "is_leaf": "is_leaf" in keywords,
        "is_leaf_at": at[0] if at else -1,
        "rules": "rules" in keywords,
    }


#: every def marked ``@c_fast_call(op)``, by its module and name, and its op
#: (on either engine: ``tests/test_fastcall.py`` checks each against its body)
FAST_CALLS: dict[str, str] = {}


def c_fast_call(op: str) -> Callable[[F], F]:
    """Decorator that says, at a public function's definition, that the C
    engine serves its common calls: ``@c_fast_call("flatten")``. The def's
    body is the specification of those calls, and it runs every other one.

    ``op`` is the operation the function makes (``_fastcall.c``'s: flatten,
    leaves, flatten_with_path, structure, unflatten, tree_map). With the C
    engine, the def is wrapped in a ``_speedups.FastCall``, which makes the
    common calls (the required arguments, ``is_leaf``, ``rules=None``:
    :func:`call_shape` reads them from the def's signature) in C and hands
    every other call to the def; ``functools.wraps`` gives it the def's
    name, docstring, signature and ``__wrapped__`` (the body, which
    ``tests/test_fastcall.py`` checks the C calls against on the
    differential corpus). With the pure engine the def is returned as it is
    (its signature is read all the same, so that a def :func:`call_shape`
    refuses fails on either engine).
    """

    def wrap(func: F) -> F:
        shape = call_shape(func)
        FAST_CALLS[f"{func.__module__}.{func.__qualname__}"] = op
        if c_engine is None:
            return func
        fc = c_engine.FastCall(func, op, _spec.TreeSpec, **shape)
        fast: Any = functools.update_wrapper(fc, func)
        # torch.compile's dynamo cannot read C; it traces the def of a wrapper
        # marked this way (torch's own convention, from torch.jit's
        # _script_if_tracing). Nothing here imports torch.
        fast.__original_fn = func
        fast.__script_if_tracing_wrapper = True
        return fast  # type: ignore[no-any-return]

    return wrap
