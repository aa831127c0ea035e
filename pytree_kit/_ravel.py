"""``ravel``: every leaf of a tree of arrays in one flat vector, and the
function that rebuilds the tree from such a vector (jax's
``jax.flatten_util.ravel_pytree``; torch's ``parameters_to_vector`` and
``vector_to_parameters``).

numpy, torch and jax are imported only inside the calls that need them: a
leaf can be a tensor only when torch is in ``sys.modules`` (a jax array only
when jax is, an array only when numpy is), so a tree of numbers never imports
torch.
"""

from __future__ import annotations

import functools
import itertools
import sys
from typing import Any, Callable

from ._keys import keystr
from ._spec import TreeSpec
from .api import IsLeaf, Rules, flatten, flatten_with_path

__all__ = ["ravel"]

_NUMBERS = (bool, int, float, complex)
# one Python number of each kind: NumPy 2 (NEP 50) and torch promote a Python
# number by its kind only, never by its value
_KIND_OF = {bool: False, int: 0, float: 0.0, complex: 0j}
_NUMERIC_KINDS = "biufc"  # numpy dtype kinds ravel takes: bool, ints, floats, complex


def ravel(
    tree: Any, *, is_leaf: IsLeaf = None, rules: Rules = None
) -> tuple[Any, Callable[[Any], Any]]:
    """Every leaf's values in one flat 1-D vector, and ``unravel(vector)``
    that rebuilds the tree: jax's ``ravel_pytree``, torch's
    ``parameters_to_vector`` for any tree.

    The leaves may be torch tensors, jax arrays, numpy arrays and numpy
    scalars, and Python numbers (bool, int, float, complex); anything else
    (or tensors with jax arrays) raises TypeError naming its path. The
    vector holds them in :func:`leaves` order, each flattened in C order, all
    cast to one dtype:

    * **torch**: when any leaf is a tensor the vector is a tensor, on the
      tensors' device (tensors on two devices: ValueError naming both paths);
      numpy leaves join it through ``torch.as_tensor``. It is made by one
      ``torch.cat`` (which casts as it copies), so it is differentiable: the
      gradient of anything computed from it reaches the leaves.
    * **jax**: when any leaf is a jax array the vector is a jax array, made
      as jax's ``ravel_pytree`` makes it (one ``jnp.concatenate``), of the
      dtype ``jnp.result_type`` gives the leaves' dtypes (jax's promotion; a
      Python number counts as jax's default dtype of its kind, as in
      ``ravel_pytree``); ``unravel`` gives jax arrays, as jax's does, and
      pickles.
    * **numpy**: otherwise the vector is a numpy array, made by one
      ``numpy.concatenate``. A tree of Python numbers only gives a numpy
      array too (numpy must then be installed: ImportError otherwise); an
      empty tree gives an empty float64 array (jax gives float32).

    The vector is always a new array, never a view of a leaf, even for a
    tree of one leaf: changing it changes no leaf.

    **The dtype** is the library's promotion of every leaf's dtype
    (``torch.promote_types``; ``numpy.result_type``), in which Python numbers
    are *weak*, as in NumPy 2 (NEP 50) and torch: they take the arrays' dtype
    unless theirs is of a higher kind (bool < int < float < complex), and
    then the library's default of that kind (numpy: int64, float64,
    complex128; torch: int64 and its default dtype). So a float32 array with
    ``0.5`` gives float32 (as jax's ``ravel_pytree`` does without x64), an
    int32 array with ``0.5`` gives float64 with numpy, float32 with torch. A
    0-d tensor promotes as any other tensor (torch's operators would let a
    1-d float32 tensor win over it). A Python int the vector's integer dtype
    cannot hold raises OverflowError naming its path (torch wraps a negative
    one into an unsigned dtype, as ``torch.tensor`` does). Where jax differs:

    * jax promotes an int with a float to that float (int64 and float32 give
      float32); numpy gives float64, torch float32.
    * with ``jax_enable_x64`` jax reads a Python float as float64 (a float32
      array with ``0.5`` gives float64); without it jax computes in 32 bits
      (an int64 array becomes int32, a float64 one float32). Here a dtype is
      kept as it is: numpy's and torch's dtypes, never narrowed.

    **unravel(vector)** takes a 1-D vector of the same library and exactly
    the right length (ValueError naming both lengths otherwise) and returns
    a tree of the same structure and containers, each leaf with its shape:

    * When every array leaf has the vector's dtype (the usual case),
      ``unravel`` accepts a vector of any dtype and the leaves take its
      dtype, as jax's does: unravelling a float64 vector of float32
      parameters gives float64 leaves. When the leaves had several dtypes,
      the vector must have the raveled dtype (TypeError otherwise, as in
      jax), and each leaf is cast back to its own dtype (from complex to
      real, the imaginary part is dropped, as in jax).
    * A Python number has no dtype: it comes back as a 0-d array (a 0-d
      tensor with torch) of the vector's dtype. A numpy scalar comes back as
      a 0-d array of its dtype; with torch, numpy leaves come back as
      tensors. Tensors come back on the leaves' original device (the vector
      is moved there).
    * The leaves never alias the vector given: ``unravel`` makes one private
      copy of it (differentiable: gradients flow back to the vector) and
      cuts it into pieces without further copies (for torch with
      ``torch.unsafe_split_with_sizes``: tensors that share that copy's
      memory but are not views, so an in-place change to one never fails a
      backward pass). Changing the vector afterwards changes no leaf; the
      leaves share one base, so keeping one keeps the whole copy alive.
      jax is functional and never has to choose; torch's
      ``vector_to_parameters`` instead points the parameters into the
      vector itself.

    ``unravel`` is an object that pickles (with the spec; a spec made with
    ``rules=`` pickles only when its rule's functions do), as jax's does.

    Examples:
        >>> import numpy as np
        >>> import pytree_kit as pk
        >>> tree = {"w": np.ones((2, 2), np.float32), "b": np.zeros(2, np.float32), "lr": 0.5}
        >>> flat, unravel = pk.ravel(tree)
        >>> flat
        array([0. , 0. , 0.5, 1. , 1. , 1. , 1. ], dtype=float32)
        >>> back = unravel(flat * 2)
        >>> back["w"]
        array([[2., 2.],
               [2., 2.]], dtype=float32)
        >>> back["lr"]
        array(1., dtype=float32)
        >>> pk.ravel([np.arange(2), 0.5])[0]  # numpy promotes int64 and a float to float64
        array([0. , 1. , 0.5])
    """
    leaves, spec = flatten(tree, is_leaf=is_leaf, rules=rules)
    where = functools.partial(_path, tree, is_leaf, rules)
    if not leaves:
        np = _numpy("an empty tree")
        return np.zeros(0, np.float64), Unravel(spec, "empty", (), (), np.dtype(np.float64))
    torch = sys.modules.get("torch")
    if torch is not None and _any_is(leaves, torch.Tensor):
        return _ravel_torch(torch, leaves, spec, where)
    jax = sys.modules.get("jax")
    if jax is not None and _any_is(leaves, jax.Array):
        return _ravel_jax(jax, leaves, spec, where)
    return _ravel_numpy(leaves, spec, where)


def _any_is(leaves: list, cls: type) -> bool:
    """Whether a leaf is a ``cls`` (the library whose vector it will be)."""
    return any(isinstance(x, cls) for x in leaves)


class Unravel:
    """The function :func:`ravel` returns: ``unravel(vector)`` rebuilds the
    tree from a vector of the same length. It holds the spec, each leaf's
    size, shape and dtype, and the device; it pickles."""

    __slots__ = ("device", "dtype", "from_dtypes", "kind", "shapes", "sizes", "spec", "starts")

    def __init__(
        self,
        spec: TreeSpec,
        kind: str,
        sizes: tuple[int, ...],
        shapes: tuple[tuple[int, ...], ...],
        dtype: Any,
        from_dtypes: tuple[Any, ...] | None = None,
        device: Any = None,
    ) -> None:
        self.spec = spec
        self.kind = kind  # "torch", "jax", "numpy" or "empty"
        self.sizes = sizes
        self.shapes = shapes
        self.dtype = dtype  # the vector's
        # each leaf's dtype, or None when every leaf had the vector's dtype
        # (then unravel takes a vector of any dtype, as jax's does)
        self.from_dtypes = from_dtypes
        self.device = device
        self.starts = tuple(itertools.accumulate(sizes, initial=0))  # the last: the length

    def __getstate__(self) -> tuple:
        return tuple(getattr(self, k) for k in self.__slots__)

    def __setstate__(self, state: tuple) -> None:
        for k, v in zip(self.__slots__, state):
            setattr(self, k, v)

    def _key(self) -> tuple:
        return (
            self.kind,
            self.spec,
            self.sizes,
            self.shapes,
            self.dtype,
            self.from_dtypes,
            self.device,
        )

    def __eq__(self, other: object) -> bool:
        """Equal when it rebuilds the same tree from the same vectors (the same
        structure, shapes and dtypes): as jax's, so a jitted function taking it
        as a static argument traces once for all of them."""
        return type(other) is Unravel and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        where = f", {self.device}" if self.device is not None else ""
        return (
            f"Unravel({self.kind}, {_count(self.starts[-1], 'element')} of {self.dtype}{where}, "
            f"{_count(len(self.sizes), 'leaf', 'leaves')}: {self.spec!r})"
        )

    def __call__(self, vector: Any) -> Any:
        if self.kind == "torch":
            return self.spec.unflatten(self._torch(vector))
        if self.kind == "numpy":
            return self.spec.unflatten(self._numpy(vector))
        if self.kind == "jax":
            return self.spec.unflatten(self._jax(vector))
        shape = getattr(vector, "shape", None)
        if shape is None:
            raise TypeError(f"unravel: expected an array or a tensor, got {type(vector).__name__}")
        self._check_shape(tuple(shape))
        return self.spec.unflatten([])

    def _check_shape(self, shape: tuple) -> None:
        total = self.starts[-1]
        if len(shape) != 1:
            raise ValueError(
                f"unravel: expected a 1-D vector of {total} elements, got shape {shape}"
            )
        if shape[0] != total:
            raise ValueError(
                f"unravel: the vector has {shape[0]} elements, but the tree has {total}"
            )

    def _check_dtype(self, dtype: Any) -> None:
        if self.from_dtypes is not None and dtype != self.dtype:
            raise TypeError(
                f"unravel: the vector is {dtype}, but the tree's leaves had several dtypes, "
                f"raveled to {self.dtype}: give a {self.dtype} vector (as jax requires)"
            )

    def _torch(self, vector: Any) -> list:
        import torch

        if not isinstance(vector, torch.Tensor):
            raise TypeError(
                f"unravel: the tree raveled to a torch tensor; got {type(vector).__name__}"
            )
        self._check_shape(tuple(vector.shape))
        self._check_dtype(vector.dtype)
        # one private copy on the leaves' device (differentiable), cut in pieces
        # that share its memory but are not views: an in-place change to one
        # never fails a backward pass
        mine = vector.to(device=self.device, copy=True)
        parts = torch.unsafe_split_with_sizes(mine, self.sizes)
        out = [p if len(s) == 1 else p.view(s) for p, s in zip(parts, self.shapes)]
        if self.from_dtypes is not None:
            complex_ = self.dtype.is_complex
            for i, dt in enumerate(self.from_dtypes):
                if dt != self.dtype:
                    x = out[i]
                    if complex_ and not dt.is_complex and dt is not torch.bool:
                        x = x.real  # the imaginary part is dropped, as in jax
                    out[i] = x.to(dt)
        return out

    def _numpy(self, vector: Any) -> list:
        import numpy as np

        if not isinstance(vector, np.ndarray):
            raise TypeError(
                f"unravel: the tree raveled to a numpy array; got {type(vector).__name__}"
            )
        self._check_shape(vector.shape)
        self._check_dtype(vector.dtype)
        mine = np.array(vector, copy=True)  # private: the leaves never alias the vector
        s = self.starts
        return self._as_leaves([mine[s[i] : s[i + 1]] for i in range(len(self.shapes))])

    def _as_leaves(self, pieces: list) -> list:
        """numpy's or jax's 1-D pieces of the vector, one a leaf, in each
        leaf's shape and, when the leaves had several dtypes, its dtype."""
        for i, shape in enumerate(self.shapes):
            if len(shape) != 1:
                pieces[i] = pieces[i].reshape(shape)
        if self.from_dtypes is not None:
            complex_ = self.dtype.kind == "c"
            for i, dt in enumerate(self.from_dtypes):
                if dt != self.dtype:
                    x = pieces[i]
                    if complex_ and dt.kind not in "cb":
                        x = x.real  # the imaginary part is dropped, as in jax
                    pieces[i] = x.astype(dt)
        return pieces

    def _jax(self, vector: Any) -> list:
        import jax
        import jax.numpy as jnp
        import numpy as np

        if not isinstance(vector, (jax.Array, np.ndarray)):
            raise TypeError(
                f"unravel: the tree raveled to a jax array; got {type(vector).__name__}"
            )
        self._check_shape(tuple(vector.shape))
        self._check_dtype(vector.dtype)
        # jax arrays are immutable: the pieces never alias anything a caller changes
        mine = jnp.asarray(vector)
        return self._as_leaves(
            jnp.split(mine, self.starts[1:-1]) if len(self.sizes) > 1 else [mine]
        )


def _count(n: int, one: str, many: str = "") -> str:
    return f"{n:,} {one if n == 1 else many or one + 's'}"


def _path(tree: Any, is_leaf: IsLeaf, rules: Rules, i: int) -> str:
    """The text of leaf ``i``'s path, ``tree['a'][0].b`` (only for errors)."""
    pairs, _ = flatten_with_path(tree, is_leaf=is_leaf, rules=rules)
    return "tree" + keystr(pairs[i][0])


def _numpy(what: str) -> Any:
    try:
        import numpy
    except ImportError:
        raise ImportError(
            f"ravel: {what} ravels to a numpy array, and numpy is not installed"
        ) from None
    return numpy


def _unsupported(x: Any, at: str) -> TypeError:
    t = type(x)
    name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    return TypeError(
        f"{at}: ravel takes torch tensors, jax arrays, numpy arrays and Python numbers "
        f"(bool, int, float, complex), not a {name}"
    )


def _bad_dtype(dtype: Any, at: str) -> TypeError:
    return TypeError(f"{at}: ravel takes arrays of booleans and numbers, not of dtype {dtype}")


def _number_kind(x: Any) -> Any:
    """A Python number of the same kind as ``x`` (bool, int, float or
    complex: all that promotion reads of a Python number), or None."""
    t = type(x)
    if t in _KIND_OF:
        return _KIND_OF[t]
    for k in _NUMBERS:  # subclasses: IntEnum, ...
        if isinstance(x, k):
            return _KIND_OF[k]
    return None


def _no_common_dtype(lib: str, dtypes: Any, e: Exception) -> TypeError:
    names = ", ".join(sorted(map(str, dtypes)))
    return TypeError(f"ravel: {lib} has no common dtype for {names}: {e}")


def _too_big(v: Any, dtype: Any, at: str, e: Exception) -> OverflowError:
    return OverflowError(f"{at}: {v!r} does not fit the vector's {dtype}: {e}")


# -- numpy ------------------------------------------------------------------


def _ravel_numpy(leaves: list, spec: TreeSpec, where: Callable[[int], str]) -> tuple[Any, Unravel]:
    np = sys.modules.get("numpy")
    if np is None:  # then no leaf is an array: Python numbers, or a leaf ravel refuses
        for i, x in enumerate(leaves):
            if _number_kind(x) is None:
                raise _unsupported(x, where(i))
        np = _numpy("a tree of Python numbers")
    # items: the leaves as arrays (None for a Python number until the dtype is known)
    items: list
    weak: dict[type, Any]
    if set(map(type, leaves)) == {np.ndarray}:
        items, weak = leaves, {}
    else:
        items, weak = _numpy_items(np, leaves, where)
    dtypes = {a.dtype for a in items if a is not None}
    for dt in dtypes:
        if dt.kind not in _NUMERIC_KINDS:
            bad = next(i for i, a in enumerate(items) if a is not None and a.dtype == dt)
            raise _bad_dtype(dt, where(bad))
    try:
        dtype = np.result_type(*dtypes, *weak.values())
    except TypeError as e:
        raise _no_common_dtype("numpy", dtypes, e) from None
    if weak:
        at = [i for i, a in enumerate(items) if a is None]
        values = [leaves[i] for i in at]
        try:
            numbers = np.array(values, dtype=dtype)
        except (OverflowError, ValueError, TypeError):
            for i, v in zip(at, values):
                try:
                    np.array(v, dtype=dtype)
                except (OverflowError, ValueError, TypeError) as e:
                    raise _too_big(v, dtype, where(i), e) from None
            raise
        for j, i in enumerate(at):
            items[i] = numbers[j : j + 1].reshape(())
    sizes = tuple([a.size for a in items])
    shapes = tuple([a.shape for a in items])
    # one copy: each leaf flattened in C order and cast as it is copied
    flat = np.concatenate(items, axis=None, dtype=dtype)
    from_dtypes = None if dtypes <= {dtype} else tuple([a.dtype for a in items])
    return flat, Unravel(spec, "numpy", sizes, shapes, dtype, from_dtypes)


def _numpy_items(np: Any, leaves: list, where: Callable[[int], str]) -> tuple[list, dict]:
    ndarray, generic = np.ndarray, np.generic
    items: list = []
    weak: dict = {}  # one Python number of each kind in the tree
    for i, x in enumerate(leaves):
        if type(x) is ndarray:
            items.append(x)
        elif isinstance(x, (ndarray, generic)):  # np.float64 is a float: before numbers
            items.append(np.asarray(x))
        else:
            k = _number_kind(x)
            if k is None:
                raise _unsupported(x, where(i))
            weak.setdefault(type(k), k)
            items.append(None)
    return items, weak


def _first(items: list, test: Callable[[Any], bool]) -> int:
    return next(i for i, a in enumerate(items) if test(a))


# -- torch ------------------------------------------------------------------


def _ravel_torch(
    torch: Any, leaves: list, spec: TreeSpec, where: Callable[[int], str]
) -> tuple[Any, Unravel]:
    tensor = torch.Tensor
    # items: the leaves as tensors (None for a Python number until the dtype is known)
    items: list
    weak: dict[type, Any]
    arrays: list[tuple[int, Any, Any]]
    if all(issubclass(c, tensor) for c in set(map(type, leaves))):
        items, weak, arrays = leaves, {}, []
    else:
        items, weak, arrays = _torch_items(torch, leaves, where)
    devices = {t.device for t in items if t is not None}
    if len(devices) > 1:
        first = _first(items, lambda t: t is not None)
        device = items[first].device
        other = _first(items, lambda t: t is not None and t.device != device)
        raise ValueError(
            f"{where(other)} is on {items[other].device}, but {where(first)} is on {device}: "
            "ravel puts every leaf in one vector, on one device"
        )
    (device,) = devices
    dtypes = {t.dtype for t in items if t is not None}
    dtypes.update(d for _, _, d in arrays)
    try:
        dtype = functools.reduce(torch.promote_types, dtypes)
        for k in weak.values():
            dtype = torch.result_type(torch.empty(0, dtype=dtype), k)
    except RuntimeError as e:  # uint16 with int64, ...
        raise _no_common_dtype("torch", dtypes, e) from None
    for i, a, _ in arrays:
        items[i] = torch.as_tensor(a, device=device)
    if weak:
        at = [i for i, t in enumerate(items) if t is None]
        values = [leaves[i] for i in at]
        try:
            numbers = torch.tensor(values, dtype=dtype, device=device)
        except (RuntimeError, OverflowError, ValueError, TypeError):
            for i, v in zip(at, values):
                try:
                    torch.tensor(v, dtype=dtype)
                except (RuntimeError, OverflowError, ValueError, TypeError) as e:
                    raise _too_big(v, dtype, where(i), e) from None
            raise
        for j, i in enumerate(at):
            items[i] = numbers[j]
    sizes = tuple([t.numel() for t in items])
    shapes = tuple([tuple(t.shape) for t in items])
    # one copy: torch.cat casts as it copies (each piece is of the vector's
    # dtype or promotes to it), so no leaf is cast on its own first
    flat = torch.cat([t.reshape(-1) for t in items])
    if flat.dtype != dtype:  # cat promotes as promote_types does: never, but be sure
        flat = flat.to(dtype)
    from_dtypes = None if dtypes <= {dtype} else tuple([t.dtype for t in items])
    return flat, Unravel(spec, "torch", sizes, shapes, dtype, from_dtypes, device)


def _torch_items(torch: Any, leaves: list, where: Callable[[int], str]) -> tuple[list, dict, list]:
    tensor = torch.Tensor
    np: Any = sys.modules.get("numpy")
    numpy_types = (np.ndarray, np.generic) if np is not None else ()
    items: list = []
    weak: dict[type, Any] = {}
    arrays: list[
        tuple[int, Any, Any]
    ] = []  # (index, numpy array, its torch dtype): tensors once the device is known
    for i, x in enumerate(leaves):
        if isinstance(x, tensor):
            items.append(x)
            continue
        items.append(None)
        if numpy_types and isinstance(x, numpy_types):  # np.float64 is a float: before numbers
            a = np.asarray(x)
            if a.dtype.kind not in _NUMERIC_KINDS:
                raise _bad_dtype(a.dtype, where(i))
            if not a.dtype.isnative:
                a = a.astype(a.dtype.newbyteorder("="))
            if not a.flags.writeable:  # torch warns on a read-only array
                a = a.copy()
            try:
                dt = torch.from_numpy(a.reshape(-1)[:0]).dtype
            except TypeError:
                raise _bad_dtype(a.dtype, where(i)) from None
            arrays.append((i, a, dt))
        else:
            k = _number_kind(x)
            if k is None:
                raise _unsupported(x, where(i))
            weak.setdefault(type(k), k)
    return items, weak, arrays


# -- jax --------------------------------------------------------------------


def _ravel_jax(
    jax: Any, leaves: list, spec: TreeSpec, where: Callable[[int], str]
) -> tuple[Any, Unravel]:
    import jax.numpy as jnp

    torch = sys.modules.get("torch")
    np: Any = sys.modules.get("numpy")
    jarray = jax.Array
    numpy_types = (np.ndarray, np.generic) if np is not None else ()
    items = []
    for i, x in enumerate(leaves):
        if isinstance(x, jarray):
            items.append(x)
        elif numpy_types and isinstance(x, numpy_types):  # np.float64 is a float: before numbers
            a = np.asarray(x)
            if a.dtype.kind not in _NUMERIC_KINDS:
                raise _bad_dtype(a.dtype, where(i))
            items.append(a)
        elif _number_kind(x) is not None:
            items.append(x)
        elif torch is not None and isinstance(x, torch.Tensor):
            raise TypeError(f"{where(i)}: ravel puts torch tensors and jax arrays in no one vector")
        else:
            raise _unsupported(x, where(i))
    arrays = [jnp.asarray(x) for x in items]
    dtypes = {a.dtype for a in arrays}
    try:  # of the leaves' dtypes, a Python number's being jax's default of its kind
        dtype = jnp.result_type(*dtypes)
    except TypeError as e:
        raise _no_common_dtype("jax", dtypes, e) from None
    sizes = tuple([int(a.size) for a in arrays])
    shapes = tuple([tuple(a.shape) for a in arrays])
    flat = jnp.concatenate([jnp.ravel(a) for a in arrays], dtype=dtype)
    from_dtypes = None if dtypes <= {dtype} else tuple([a.dtype for a in arrays])
    return flat, Unravel(spec, "jax", sizes, shapes, dtype, from_dtypes)
