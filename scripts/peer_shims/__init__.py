"""Thin name mappings from the peers' tree APIs to pytree_kit, for
``scripts/peer_suites.py``: each ``<suite>_shim.py`` module's ``install()``
puts pytree_kit behind the names a peer's own test file calls, as the
migration guide in ``docs/migration/`` maps them.

A test that reaches a function the guides say pytree_kit does not have, or a
registry, is *not applicable*: :func:`not_applicable` skips it with a reason
beginning ``not applicable:``. A test that calls none of the mapped functions
tests the peer, not pytree_kit, and is not applicable too (``plugin.py``
counts the calls through :func:`mapped`). Nothing is fetched; nothing in this
package is imported by pytree_kit.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any, NoReturn

import pytest

NA = "not applicable: "

#: Calls made through :func:`mapped` functions since the plugin last reset it.
CALLS = [0]


def not_applicable(why: str) -> NoReturn:
    """Skip the running test as not applicable (pytest's Skipped is a
    BaseException: no ``pytest.raises(Exception)`` or ``except Exception`` in
    the peer's test swallows it)."""
    raise pytest.skip.Exception(NA + why, _use_item_location=True)


def mapped(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``fn`` as a call into pytree_kit, so a test making it is counted."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        CALLS[0] += 1
        return fn(*args, **kwargs)

    call.__peer_mapped__ = True  # type: ignore[attr-defined]
    return call


def missing(name: str, why: str = "pytree_kit has no counterpart") -> Callable[..., Any]:
    """A stand-in for the peer's ``name``: calling it makes the test not
    applicable, with the reason the guide gives."""

    def call(*args: Any, **kwargs: Any) -> NoReturn:
        not_applicable(f"{name}: {why}")

    call.__name__ = call.__qualname__ = name
    call.__peer_missing__ = True  # type: ignore[attr-defined]
    return call


def registry(name: str) -> Callable[..., Any]:
    """A stand-in for a registry function: its tests are not applicable."""
    return missing(name, "a registry (pytree_kit has none)")


def unmapped(modules: list[types.ModuleType]) -> list[str]:
    """The public functions of ``modules`` (a shim's patched peer modules)
    that are neither :func:`mapped`, :func:`missing` nor :func:`kept`: calls
    that would reach the peer's own implementation. Functions the peer's
    module only imports from elsewhere (``typing.cast``,
    ``collections.namedtuple``) are not the peer's and are left alone."""
    left = []
    marks = ("__peer_mapped__", "__peer_missing__", "__peer_kept__")
    for module in modules:
        package = module.__name__.split(".")[0]
        for name in dir(module):
            value = getattr(module, name)
            if name.startswith("_") or not isinstance(
                value, (types.FunctionType, types.BuiltinFunctionType)
            ):
                continue
            if any(getattr(value, mark, False) for mark in marks):
                continue
            if (getattr(value, "__module__", None) or package).split(".")[0] == package:
                left.append(f"{module.__name__}.{name}")
    return left


def kept(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Keep the peer's own ``fn`` (a registration function: the user's setup,
    which the registry bridges read), marked so that :func:`unmapped` passes
    it; calling it counts as no call into pytree_kit."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    call.__peer_kept__ = True  # type: ignore[attr-defined]
    return call


class SpecWrapper:
    """A ``pk.TreeSpec`` under a peer's spec class name (the shims' spec
    classes subclass it and rename its methods): equal, hashed and pickled
    as the spec it holds, with its leaves and nodes counted, unflatten and
    flatten_up_to."""

    __slots__ = ("spec",)
    spec: Any

    @classmethod
    def wrap(cls, spec: Any) -> Any:
        out = object.__new__(cls)
        object.__setattr__(out, "spec", spec)
        return out

    @staticmethod
    def unwrap(x: Any) -> Any:
        """The pytree_kit spec of a wrapped one; anything else as it is."""
        return x.spec if isinstance(x, SpecWrapper) else x

    def __eq__(self, other: object) -> bool:
        return isinstance(other, type(self)) and self.spec == other.spec

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self.spec)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self).wrap, (self.spec,))

    # what every peer's spec has under pytree_kit's names

    @property
    def num_leaves(self) -> int:
        return self.spec.num_leaves

    @property
    def num_nodes(self) -> int:
        return self.spec.num_nodes

    @mapped
    def unflatten(self, leaves: Any) -> Any:
        return self.spec.unflatten(leaves)

    @mapped
    def flatten_up_to(self, tree: Any) -> list[Any]:
        return self.spec.flatten_up_to(tree)


#: (original, packages) of each function replace_everywhere replaced
REPLACED: list[tuple[Any, tuple[str, ...]]] = []


def replace_everywhere(original: Any, replacement: Any, packages: tuple[str, ...]) -> list[str]:
    """Put ``replacement`` in place of ``original`` in every loaded module of
    ``packages`` that holds it (a module that imported it by name keeps its
    own reference: each is patched); the names of the modules patched."""
    REPLACED.append((original, packages))
    return _holding(original, packages, replacement)


def _holding(original: Any, packages: tuple[str, ...], replacement: Any = None) -> list[str]:
    import sys

    found = []
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in packages:
            continue
        for attr, value in list(vars(module).items()):
            if value is original:
                if replacement is not None:
                    setattr(module, attr, replacement)
                found.append(f"{name}.{attr}")
    return sorted(set(found))


def left_behind() -> list[str]:
    """The modules that still hold a function :func:`replace_everywhere`
    replaced (loaded after it ran, or missed): calls that would reach the peer."""
    return [place for original, packages in REPLACED for place in _holding(original, packages)]


def taken_view(name: str, functions: dict[str, Any]) -> types.ModuleType:
    """A module named ``name`` (one of the peer's) that holds only the
    functions a shim takes over, as it put them there: what the check that
    a shim leaves nothing unmapped reads, for a peer whose tree function is
    one of many in its module (the others are its own machinery: gathering,
    padding, logging), which the shim leaves alone."""
    view = types.ModuleType(name)
    for attr, value in functions.items():
        setattr(view, attr, value)
    return view
