"""A persistent mapping for an image's topic maps: a shared base dict plus a small overlay of
the changes made since, so that creating, changing or deleting one topic of a 20,000-topic image
copies the overlay, not every topic.

The overlay is folded into a new base once it outgrows ``2 * sqrt(len(base))`` entries (at least
64), which keeps both the per-update copy and the amortised fold small. Iteration order is a
plain dict's: a changed key keeps its place, a new key goes last, a deleted and re-added key goes
last (the map folds first), so every node iterates a map the same way however its updates were
batched.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from math import isqrt
from typing import Any, Generic, TypeVar

__all__ = ["PersistentMap", "as_persistent_map"]

K = TypeVar("K")
V = TypeVar("V")

_GONE: Any = object()  # overlay value of a base key deleted since the base was folded
_MISS: Any = object()

_MIN_OVERLAY = 64


class PersistentMap(Mapping[K, V], Generic[K, V]):
    """An immutable mapping; :meth:`updated` returns a new one and leaves this one as it was.
    Neither dict it holds is mutated after construction, so maps share them freely."""

    __slots__ = ("_base", "_len", "_over")

    def __init__(self, base: dict[K, V], over: dict[K, Any], length: int) -> None:
        self._base = base
        self._over = over
        self._len = length

    @classmethod
    def of(cls, items: Mapping[K, V]) -> PersistentMap[K, V]:
        """A map holding ``items`` (copied)."""
        return cls(dict(items), {}, len(items))

    # ---- reads ------------------------------------------------------------------------------

    def __getitem__(self, key: K) -> V:
        value = self._over.get(key, _MISS)
        if value is _MISS:
            return self._base[key]
        if value is _GONE:
            raise KeyError(key)
        return value  # type: ignore[no-any-return]  # overlay values are V or _GONE

    def get(self, key: K, default: Any = None) -> Any:
        value = self._over.get(key, _MISS)
        if value is _MISS:
            return self._base.get(key, default)
        return default if value is _GONE else value

    def __contains__(self, key: object) -> bool:
        value = self._over.get(key, _MISS)  # type: ignore[arg-type]  # any hashable may be asked
        if value is _MISS:
            return key in self._base
        return value is not _GONE

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[K]:
        over = self._over
        if not over:
            return iter(self._base)
        return self._iter_keys()

    def _iter_keys(self) -> Iterator[K]:
        over, base = self._over, self._base
        for key in base:
            if over.get(key, _MISS) is not _GONE:
                yield key
        for key in over:
            if key not in base:
                yield key

    def items(self) -> Iterator[tuple[K, V]]:  # type: ignore[override]  # Mapping's items() is a view; ours iterates once
        over, base = self._over, self._base
        if not over:
            yield from base.items()
            return
        for key, value in base.items():
            changed = over.get(key, _MISS)
            if changed is _MISS:
                yield key, value
            elif changed is not _GONE:
                yield key, changed
        for key, value in over.items():
            if key not in base:
                yield key, value

    def values(self) -> Iterator[V]:  # type: ignore[override]  # Mapping's values() is a view; ours iterates once
        if not self._over:
            return iter(self._base.values())
        return (value for _, value in self.items())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PersistentMap):
            if self._base is other._base and self._over is other._over:
                return True
            return self._len == other._len and dict(self.items()) == dict(other.items())
        if isinstance(other, Mapping):
            return self._len == len(other) and dict(self.items()) == dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a mapping, like dict: not hashable

    def __repr__(self) -> str:
        return f"PersistentMap({dict(self.items())!r})"

    def __reduce__(self) -> tuple[Any, ...]:  # pickled folded: the tombstone is this process's
        return (PersistentMap.of, (dict(self.items()),))

    # ---- updates ----------------------------------------------------------------------------

    def updated(
        self, sets: Mapping[K, V] | None = None, deletes: Iterable[K] = ()
    ) -> PersistentMap[K, V]:
        """A new map with ``deletes`` removed (each must be present), then ``sets`` set."""
        base, over, length = self._base, dict(self._over), self._len
        for key in deletes:
            if over.get(key, _MISS) is _GONE or (key not in over and key not in base):
                raise KeyError(key)
            if key in base:
                over[key] = _GONE
            else:
                del over[key]
            length -= 1
        for key, value in (sets or {}).items():
            prev = over.get(key, _MISS)
            if prev is _GONE:  # re-added after a delete: fold, so that it goes last as in a dict
                base, over = _fold(base, over), {}
                prev = _MISS
            if prev is _MISS and key not in base:
                length += 1
            over[key] = value
        if len(over) > max(_MIN_OVERLAY, 2 * isqrt(len(base))):
            base, over = _fold(base, over), {}
        return PersistentMap(base, over, length)


def _fold(base: dict[K, V], over: dict[K, Any]) -> dict[K, V]:
    """``base`` with ``over`` applied, in dict order (a new dict; neither argument changes)."""
    out = base.copy()
    out.update(over)  # a changed key keeps its place, a new one goes last
    for key in [key for key, value in over.items() if value is _GONE]:
        del out[key]
    return out


def as_persistent_map(items: Mapping[K, V]) -> PersistentMap[K, V]:
    """``items`` as a PersistentMap: itself when it is one, else wrapping the (read-only) dict
    without copying it."""
    if isinstance(items, PersistentMap):
        return items
    if isinstance(items, dict):
        return PersistentMap(items, {}, len(items))
    return PersistentMap.of(items)
