"""transformers' ``ModelOutput`` in small: the one copy of its behaviour that the
test trees (``trees.ModelOutput``) and the benchmark corpus
(``benchmarks/corpus.py``'s ``CausalLMOutput``) subclass with their own fields.

It imports nothing outside the standard library, so the benchmarks import it
without the test tools. A subclass is a ``@dataclasses.dataclass`` whose fields
default to None:

>>> import dataclasses
>>> @dataclasses.dataclass
... class Out(ModelOutputBase):
...     loss: object = None
...     logits: object = None
>>> out = Out(logits=1)
>>> list(out.items())
[('logits', 1)]
>>> out["loss"] = 2  # an entry set is an attribute too
>>> out.loss
2
>>> Out([("logits", 3)])["logits"]  # (key, value) pairs as the first argument
3
"""

from __future__ import annotations

import dataclasses
import types
from collections import OrderedDict
from typing import Any


class ModelOutputBase(OrderedDict):
    """A dataclass that is an OrderedDict, as transformers' ``ModelOutput`` is:
    its entries are its fields that are not None, in field order, kept in step
    by ``__setitem__`` and ``__setattr__``. As transformers' does, it takes
    (key, value) pairs (a dict, list, tuple or generator of them) as its first
    argument when the other fields are None, which is how dm-tree rebuilds a
    mapping (``type(m)((k, v) for ...)``); a first field that is not such pairs
    is a plain value."""

    def __post_init__(self) -> None:
        fields = dataclasses.fields(self)  # type: ignore[arg-type]
        first = getattr(self, fields[0].name)
        others_none = all(getattr(self, f.name) is None for f in fields[1:])
        if others_none and isinstance(first, (dict, list, tuple, types.GeneratorType)):
            items = first.items() if isinstance(first, dict) else first
            for i, element in enumerate(items):
                if not (
                    isinstance(element, (list, tuple))
                    and len(element) == 2
                    and isinstance(element[0], str)
                ):
                    if i == 0:  # a plain first field after all
                        self[fields[0].name] = first
                        return
                    raise ValueError(f"cannot set key/value for {element!r}")
                setattr(self, element[0], element[1])
                if element[1] is not None:
                    self[element[0]] = element[1]
            return
        for f in fields:
            v = getattr(self, f.name)
            if v is not None:
                self[f.name] = v

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        super().__setattr__(key, value)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.keys() and value is not None:
            super().__setitem__(name, value)
        super().__setattr__(name, value)
