"""The exceptions pytree_kit defines.

:class:`StructureError` is raised wherever two structures must match and do
not: a tree against a spec (``flatten_up_to``, ``tree_map``'s other trees,
``TreeSpec.columns``), two trees (``assert_same_structure``,
``tree_combine``), a checkpoint against its template. It is both a
``ValueError``, as jax and optree raise there, and a ``TypeError``, as
dm-tree raises, so code written against any of them catches it unchanged.
"""

from __future__ import annotations

__all__ = ["StructureError"]


class StructureError(ValueError, TypeError):
    """Two structures differ where they must match; the message names the
    path of the first difference and what each side has there.

    A ``ValueError`` (jax's and optree's exception for a mismatch) and a
    ``TypeError`` (dm-tree's), so each camp's ``except`` catches it.

    Examples:
        >>> import pytree_kit as pk
        >>> try:  # doctest: +ELLIPSIS
        ...     pk.structure([0, 0]).flatten_up_to([1, 2, 3])
        ... except TypeError as e:  # dm-tree's camp; ValueError works too
        ...     print(type(e).__name__, "|", e)
        StructureError | tree: structure mismatch: the spec has a list of 2, the tree has a list...
    """


StructureError.__module__ = "pytree_kit"
