"""Type stub for the C engine; it has the interface of pytree_kit._pure."""

from typing import Any, Callable, Iterable, Iterator, Optional

from ._spec import TreeSpec

NAME: str
#: 1 when dataclass fields are read from CPython 3.11's instance values directly
VALUES_READS: int
#: 1 when dict tables are read directly and unflatten copies dicts of repeated keys
DICT_TABLES: int
#: 1 on the CPython versions whose layouts the fast paths were validated on (GIL builds)
VALIDATED_PYTHON: int
#: 1 when built with PYTREE_KIT_NO_FAST_PATHS=1: every layout-reading fast path left out
NO_FAST_PATHS: int
#: 1 where the GIL guards the engine: it keeps tuple and list nodes, order
#: pairs, spare tuples and spec plans across calls (0: it keeps none of them)
KEEP_ACROSS_CALLS: int
#: 1 where a class's plan is kept across calls (under its version tag)
PLANS_KEPT: int
#: each fast path, on or off on this interpreter (after the checks made on import)
FAST_PATHS: dict[str, bool]

def flatten(
    tree: Any, is_leaf: Optional[Callable[[Any], bool]] = None, rules: Any = None, /
) -> tuple[list[Any], TreeSpec]: ...
def leaves(
    tree: Any, is_leaf: Optional[Callable[[Any], bool]] = None, rules: Any = None, /
) -> list[Any]: ...
def flatten_with_path(
    tree: Any,
    is_leaf: Optional[Callable[..., bool]] = None,
    rules: Any = None,
    is_leaf_takes_path: bool = False,
    /,
) -> tuple[list[tuple[tuple[Any, ...], Any]], TreeSpec]: ...
def unflatten(spec: TreeSpec, leaves: Iterable[Any], /) -> Any: ...
def flatten_up_to(
    spec: TreeSpec, tree: Any, label: str = ..., other: str = ..., /
) -> list[Any]: ...
def flatten_up_to_columns(
    spec: TreeSpec, trees: Iterable[Any], label: str = ..., other: str = ..., /
) -> list[list[Any]]: ...
def first_reaching(
    leaves: list[Any],
    start: int,
    target: type,
    skip: tuple[type, ...],
    opaque: tuple[type, ...],
    registered: Any,
    limit: int,
    /,
) -> int: ...
def spec_compose(
    outer_nodes: tuple[Any, ...],
    outer_orders: tuple[Any, ...],
    inner_nodes: tuple[Any, ...],
    inner_orders: tuple[Any, ...],
    /,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]: ...
def spec_is_prefix(mine: tuple[Any, ...], theirs: tuple[Any, ...], /) -> bool: ...
def keystr(path: Iterable[Any], /) -> str: ...
def spec_paths(nodes: tuple[Any, ...], /) -> list[tuple[Any, ...]]: ...
def path_get(tree: Any, path: tuple[Any, ...], /) -> tuple[Any, int]: ...
def tree_get(
    tree: Any, path: tuple[Any, ...], is_leaf: Any = None, rules: Any = None, /
) -> Any: ...  # _pure.tree_get itself
def iter_leaves(
    tree: Any, is_leaf: Optional[Callable[[Any], bool]] = None, rules: Any = None, /
) -> Iterator[Any]: ...
def flatten_one_level(
    tree: Any, is_leaf: Optional[Callable[[Any], bool]] = None, rules: Any = None, /
) -> Optional[tuple[list[Any], Any]]: ...
def any_leaf(
    tree: Any, is_leaf: Optional[Callable[[Any], bool]], rules: Any, want: bool, /
) -> bool: ...
def packed_sample(
    bufs: tuple[Any, ...], specs: Any, i: int, make: Callable[[int, int, int, Any], Any], /
) -> Any: ...
def number_list(x: Any, /) -> bool: ...
def leaf_codes(leaves: list[Any], /) -> tuple[Any, ...]: ...
def _field_codes(cls: type, names: tuple[str, ...], /) -> tuple[int, ...]: ...
def _plans_made() -> int: ...
def _plan_set(cls: type) -> tuple[int, int]: ...

class FastCall:
    """``func`` with its common calls made in C (see ``_engine.c_fast_call``)."""

    __wrapped__: Callable[..., Any]
    def __init__(
        self,
        func: Callable[..., Any],
        op: str,
        spec_type: type,
        npos: int,
        is_leaf: bool,
        is_leaf_at: int,
        rules: bool,
    ) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
    def __get__(self, obj: Any, objtype: Optional[type] = None) -> Any: ...
