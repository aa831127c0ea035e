"""What an engine provides: the one declaration both engines answer to.

pytree_kit has two engines that give the same results: the pure-Python one
(``_pure``, the specification) and the C one (``_speedups``). ``_engine``
chooses one at import and hands it here (:func:`use`); every module that
calls an engine reads it here, at call time, as ``_interface.engine``: the
one place the engine is found. ``Engine`` below is what it provides. Each
operation is declared once here, with its signature: its operands are
positional (the C engine takes no keywords), and the trailing ones with
defaults may be left out.
This Protocol is the interface's one declaration; everything else is read
from it or checked against it. ``OPERATIONS``, ``TRACED`` (the operations
``torch.compile`` traces, marked ``@traced``, which ``_dynamo`` registers)
and ``CONSTANTS`` are read from it here. ``tests/test_interface.py`` checks
both engines against it (every member is there, and every operation takes
the same positional arguments, required and optional, as declared here; the
C engine's method table has no public function it lacks) and the C engine's
stub, ``_speedups.pyi``, too (the same operations, taking the same
arguments). Adding an operation is its declaration here and its two
implementations, ``_pure``'s and the C one (with its line in the stub).

This module imports nothing of pytree_kit, so every layer may import it.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Protocol, TypeVar

__all__ = [
    "C_BINDINGS",
    "CONSTANTS",
    "OPERATIONS",
    "TRACED",
    "Engine",
    "engine",
    "use",
    "traced",
]

#: a ``TreeSpec`` (``_spec``, which sits above this module and calls the engine)
TreeSpec = Any

#: a callable ``make(code, a, first, shape)`` that rebuilds a packed tensor
#: or pickled leaf (``PackedList``'s store)
Make = Callable[[int, int, int, Any], Any]

F = TypeVar("F", bound=Callable[..., Any])


def traced(fn: F) -> F:
    """Marks an operation that ``torch.compile`` traces: dynamo is given the
    pure engine's function as its stand-in for the C one (``_dynamo``)."""
    fn.__pk_traced__ = True  # type: ignore[attr-defined]
    return fn


class Engine(Protocol):
    """The operations and constants every engine module provides."""

    #: ``"c"`` or ``"python"``
    NAME: str

    # -- walking a tree: a tree's leaves and its spec --------------------------

    @traced
    def flatten(
        self, tree: Any, is_leaf: Any = None, rules: Any = None, /
    ) -> tuple[list, TreeSpec]:
        """The leaves of ``tree`` in order, and its spec."""

    @traced
    def leaves(self, tree: Any, is_leaf: Any = None, rules: Any = None, /) -> list:
        """The leaves of ``tree`` in order (``flatten`` without the spec)."""

    @traced
    def iter_leaves(self, tree: Any, is_leaf: Any = None, rules: Any = None, /) -> Iterator[Any]:
        """The leaves of ``tree``, one at a time."""

    @traced
    def flatten_one_level(self, tree: Any, is_leaf: Any = None, rules: Any = None, /) -> Any:
        """``(children, spec)`` of the top node of ``tree``, or None for a leaf."""

    @traced
    def any_leaf(self, tree: Any, is_leaf: Any, rules: Any, want: bool, /) -> bool:
        """Whether some leaf's truth is ``want`` (the walk stops at the first)."""

    @traced
    def flatten_with_path(
        self,
        tree: Any,
        is_leaf: Any = None,
        rules: Any = None,
        is_leaf_takes_path: Any = False,
        /,
    ) -> tuple[list, TreeSpec]:
        """``[(path, leaf), ...]`` and the spec."""

    @traced
    def path_get(self, tree: Any, path: tuple, /) -> tuple:
        """``(node, done)``: how far ``path`` reads into ``tree``'s builtin containers."""

    def tree_get(self, tree: Any, path: tuple, is_leaf: Any = None, rules: Any = None, /) -> Any:
        """What stands at ``path`` (a tuple of keys) in ``tree``: a leaf or a subtree."""

    @traced
    def keystr(self, path: Any, /) -> str:
        """``''.join(map(str, path))``."""

    # -- a spec and leaves: building and matching ------------------------------

    @traced
    def unflatten(self, spec: TreeSpec, leaves: Any, /) -> Any:
        """The tree of ``spec`` with ``leaves`` in its places."""

    @traced
    def flatten_up_to(
        self, spec: TreeSpec, tree: Any, label: str = "the spec", other: str = "the tree", /
    ) -> list:
        """The subtrees of ``tree`` at the leaves of ``spec`` (a prefix of its structure)."""

    def flatten_up_to_columns(
        self, spec: TreeSpec, trees: Any, label: str = "the spec", other: str = "the tree", /
    ) -> list:
        """``flatten_up_to`` of each of ``trees``, as one list per leaf of ``spec``."""

    # -- a spec's nodes --------------------------------------------------------

    @traced
    def spec_compose(
        self, outer_nodes: tuple, outer_orders: tuple, inner_nodes: tuple, inner_orders: tuple, /
    ) -> tuple:
        """``(nodes, orders)`` of ``inner`` put at every leaf of ``outer``."""

    @traced
    def spec_is_prefix(self, mine: tuple, theirs: tuple, /) -> bool:
        """Whether the nodes ``mine`` are a prefix of ``theirs``."""

    @traced
    def spec_paths(self, nodes: tuple, /) -> list:
        """The path of each leaf of the spec of ``nodes``."""

    # -- the torch adapters' helpers -------------------------------------------

    def first_reaching(
        self,
        leaves: list,
        start: int,
        target: type,
        skip: tuple,
        opaque: tuple,
        registered: Any,
        limit: int,
        /,
    ) -> int:
        """The index of the first of ``leaves`` from ``start`` on from which an
        instance of ``target`` may be reached, or -1."""

    def packed_sample(self, bufs: tuple, specs: Any, i: int, make: Make, /) -> Any:
        """Sample ``i`` of a ``PackedList``, rebuilt from its buffers."""

    def number_list(self, x: Any, /) -> bool:
        """Whether ``x`` is a non-empty list of exact ints or of exact floats."""

    def leaf_codes(self, leaves: list, /) -> tuple:
        """Each leaf's packing code in a ``PackedList``, or None."""


#: the operations of ``Engine``, in the order declared: read from it, the
#: one declaration
OPERATIONS = tuple(
    name for name, v in vars(Engine).items() if callable(v) and not name.startswith("_")
)
#: the operations ``torch.compile`` traces (marked ``@traced`` above)
TRACED = tuple(name for name in OPERATIONS if getattr(vars(Engine)[name], "__pk_traced__", False))
#: the constants of ``Engine``
CONSTANTS = tuple(Engine.__annotations__)


#: The Python functions the C engine calls, by module: it reads them by name
#: when it loads (``_speedups.c``'s ``constants_init``), and
#: ``tests/test_interface.py`` checks that these are the names it reads and
#: that each is there. ``_pure``'s are steps of the specification the C
#: engine leaves to it (the rare kinds of node, class plans, the insertion
#: order of dicts, a user's ``__tree_flatten__`` result checked); the
#: ``_messages`` ones give the text of the errors both engines raise.
C_BINDINGS = {
    "_pure": (
        "classify",
        "class_plan",
        "dict_order_differs",
        "dict_order",
        "_custom_result",
        "_rule_result",
        "_match",
        "_mismatch",
        "build",
        "tree_get",
    ),
    "_messages": ("refuse_leaves", "refuse_trees", "cycle_error"),
}


#: The engine the package calls, read at call time as ``_interface.engine``;
#: ``_engine`` sets it on import, through :func:`use`.
engine: Engine


def use(chosen: Engine) -> None:
    """Make ``chosen`` the engine every module calls from now on.

    ``_engine`` calls it once, on import, with the engine it chose. A test
    may call it to run the package on the other engine, and puts the first
    one back when it is done.
    """
    global engine
    engine = chosen
