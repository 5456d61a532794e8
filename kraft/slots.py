"""A faster ``__init__`` for frozen slotted dataclasses built in hot paths.

The dataclass ``__init__`` of a frozen class sets every field through ``object.__setattr__``;
setting each slot through its descriptor instead costs about half. :func:`slot_init` builds such
an ``__init__`` with the same parameters and defaults (so keyword calls and
``dataclasses.replace`` keep working); fields with ``init=False`` get their default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any


def slot_init(cls: type) -> Callable[..., None]:
    """An ``__init__`` for the frozen, slotted dataclass ``cls`` (no ``__post_init__``, no
    ``default_factory``)."""
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has a __post_init__")
    env: dict[str, Any] = {}
    params: list[str] = []
    body: list[str] = []
    for i, f in enumerate(fields(cls)):
        if f.default_factory is not MISSING:
            raise TypeError(f"{cls.__name__}.{f.name} has a default_factory")
        env[f"_s{i}"] = cls.__dict__[f.name].__set__
        if f.default is not MISSING:
            env[f"_d{i}"] = f.default
        if not f.init:
            body.append(f"    _s{i}(self, _d{i})")
            continue
        params.append(f.name if f.default is MISSING else f"{f.name}=_d{i}")
        body.append(f"    _s{i}(self, {f.name})")
    header = f"def __init__(self{''.join(', ' + p for p in params)}):"
    source = "\n".join([header, *(body or ["    pass"])])
    exec(source, env)
    init: Callable[..., None] = env["__init__"]
    init.__qualname__ = f"{cls.__name__}.__init__"
    return init
