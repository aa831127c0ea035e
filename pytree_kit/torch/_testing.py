"""``assert_close`` over any tree: torch.testing's check, leaf by leaf, with
the path of the first mismatch in the message."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch.testing

from .. import _interface
from .._compare import first_difference, mismatch_text
from .._keys import where
from .._kinds import check_rules

__all__ = ["assert_close"]


def assert_close(
    actual: Any,
    expected: Any,
    *,
    is_leaf: Optional[Callable[[Any], bool]] = None,
    rules: Any = None,
    **torch_kwargs: Any,
) -> None:
    """``torch.testing.assert_close`` for trees of every kind pytree_kit
    knows: dataclasses, attrs classes, namedtuples, protocol classes and
    ``rules=`` classes as well as the lists and dicts torch itself walks.

    The structures must be equal (as ``pytree_kit.assert_same_structure``
    sees them); then each leaf of ``actual`` is checked against the leaf of
    ``expected`` at its place with ``torch.testing.assert_close(**torch_kwargs)``
    (``rtol``, ``atol``, ``equal_nan``, ``check_dtype``, ...). A leaf torch
    cannot compare (a str, an object of your own) must be ``==``. The
    AssertionError names the path of the first mismatch, above torch's message.

    Examples:
        >>> import dataclasses, torch
        >>> from pytree_kit.torch import assert_close
        >>> @dataclasses.dataclass
        ... class Out:
        ...     logits: torch.Tensor
        ...     name: str
        >>> assert_close([Out(torch.ones(2), "a")], [Out(torch.ones(2) + 1e-7, "a")])
        >>> assert_close([Out(torch.ones(2), "a")], [Out(torch.zeros(2), "a")])
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        AssertionError: tree[0].logits: Tensor-likes are not close!
        ...
    """
    rules = check_rules(rules)
    pairs, spec = _interface.engine.flatten_with_path(actual, is_leaf, rules)
    leaves, other = _interface.engine.flatten(expected, is_leaf, rules)
    found = first_difference(spec, other)
    if found is not None:
        raise AssertionError(mismatch_text(found, "actual", "expected"))
    for (path, a), e in zip(pairs, leaves):
        try:
            torch.testing.assert_close(a, e, **torch_kwargs)
        except AssertionError as exc:
            raise AssertionError(f"{where(path)}: {exc}") from None
        except TypeError as exc:
            # not a pair torch compares (str, bytes, an object of the user's);
            # any other TypeError (a wrong keyword) is the caller's to see
            if not str(exc).startswith("No comparison pair"):
                raise
            if type(a) is not type(e) or not a == e:
                raise AssertionError(
                    f"{where(path)}: {a!r} != {e!r} (compared with ==: "
                    "torch.testing does not compare these)"
                ) from None
