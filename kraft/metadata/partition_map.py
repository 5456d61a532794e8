"""The partition map: a persistent ``Mapping[int, PartitionRegistration]`` (one topic's
partitions) split into chunks, so that changing one partition copies one chunk plus the chunk
index: chunks of 16 ids while every id is below 4096 (a change to a 100-partition topic copies
~23 references, not 101), of 1024 ids beyond (a change to a 1,000,000-partition topic copies a
1024-id chunk and a ~1,000-entry index, not a 62,500-entry one)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import chain
from operator import itemgetter
from typing import Any, ClassVar

from kraft.metadata.registrations import PartitionRegistration

__all__ = [
    "PartitionMap",
    "as_partition_map",
    "partition_chunks",
    "sorted_partition_columns",
    "sorted_partition_items",
]

_first = itemgetter(0)

_SMALL_SHIFT = 4  # 16 partition ids per chunk while every id is below _SMALL_LIMIT
_LARGE_SHIFT = 10  # 1024 ids per chunk from there on
_SMALL_LIMIT = 1 << 12  # so a small-chunk index holds at most 256 chunks


def _shift_for(highest_id: int) -> int:
    return _SMALL_SHIFT if highest_id < _SMALL_LIMIT else _LARGE_SHIFT


class PartitionMap(Mapping[int, PartitionRegistration]):
    """An immutable ``Mapping[int, PartitionRegistration]`` stored as chunks of ``1 << shift``
    ids, so that :meth:`updated` copies only the chunks it touches (plus the chunk index). Small
    chunks keep what a change copies, and what the cyclic collector walks after it, small; a map
    whose ids reach ``_SMALL_LIMIT`` is rebuilt once with large chunks."""

    __slots__ = ("_chunks", "_len", "_shift")

    EMPTY: ClassVar[PartitionMap]

    def __init__(
        self,
        chunks: dict[int, dict[int, PartitionRegistration]],
        length: int,
        shift: int = _SMALL_SHIFT,
    ) -> None:
        self._chunks = chunks
        self._len = length
        self._shift = shift

    @classmethod
    def of(cls, partitions: Mapping[int, PartitionRegistration]) -> PartitionMap:
        """A map holding ``partitions`` (copied)."""
        return PartitionMap.EMPTY.updated(partitions)

    @classmethod
    def of_columns(
        cls, ids: Sequence[int], registrations: Iterable[PartitionRegistration]
    ) -> PartitionMap:
        """A map of ``ids[i] -> registrations[i]`` (a later duplicate id wins, as in a dict),
        built without copying: the same map as ``of(dict(zip(ids, registrations)))``."""
        if (
            type(ids) is list
            and ids
            and type(ids[0]) is int
            and ids == list(range(ids[0], ids[0] + len(ids)))
        ):
            return cls._of_run(ids[0], list(registrations)[: len(ids)])
        partitions = dict(zip(ids, registrations))
        if not partitions:
            return PartitionMap.EMPTY
        lowest, highest = min(partitions), max(partitions)
        shift = _shift_for(highest)
        if lowest >> shift == highest >> shift:
            return PartitionMap({lowest >> shift: partitions}, len(partitions), shift)
        chunks: dict[int, dict[int, PartitionRegistration]] = {}
        for pid, reg in partitions.items():
            chunk = chunks.get(pid >> shift)
            if chunk is None:
                chunk = chunks[pid >> shift] = {}
            chunk[pid] = reg
        return PartitionMap(chunks, len(partitions), shift)

    @classmethod
    def _of_run(cls, lowest: int, regs: list[PartitionRegistration]) -> PartitionMap:
        """The map of ids ``lowest, lowest + 1, ...`` to ``regs`` (a snapshot's topic frame),
        cut into chunks by slicing, without a Python step per partition."""
        if not regs:
            return PartitionMap.EMPTY
        highest = lowest + len(regs) - 1
        shift = _shift_for(highest)
        chunks: dict[int, dict[int, PartitionRegistration]] = {}
        start = lowest
        while start <= highest:
            end = min(((start >> shift) + 1) << shift, highest + 1)
            chunks[start >> shift] = dict(
                zip(range(start, end), regs[start - lowest : end - lowest])
            )
            start = end
        return PartitionMap(chunks, len(regs), shift)

    def __getitem__(self, pid: int) -> PartitionRegistration:
        chunk = self._chunks.get(pid >> self._shift)
        if chunk is None:
            raise KeyError(pid)
        return chunk[pid]

    def get(self, pid: int, default: Any = None) -> Any:
        chunk = self._chunks.get(pid >> self._shift)
        if chunk is None:
            return default
        return chunk.get(pid, default)

    def __contains__(self, pid: object) -> bool:
        if type(pid) is not int:
            return False
        chunk = self._chunks.get(pid >> self._shift)
        return chunk is not None and pid in chunk

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[int]:
        for ci in sorted(self._chunks):
            yield from self._chunks[ci]

    def items(self) -> Iterator[tuple[int, PartitionRegistration]]:  # type: ignore[override]  # Mapping's items() is a view; ours yields in chunk order
        for ci in sorted(self._chunks):
            yield from self._chunks[ci].items()

    def values(self) -> Iterator[PartitionRegistration]:  # type: ignore[override]  # Mapping's values() is a view; ours yields in chunk order
        for ci in sorted(self._chunks):
            yield from self._chunks[ci].values()

    def chunks(self) -> list[dict[int, PartitionRegistration]]:
        """The chunks (id -> registration dicts, read-only), by their ids: iterating them visits
        every partition without a generator step per partition (a scan of a whole image)."""
        chunks = self._chunks
        return [chunks[ci] for ci in sorted(chunks)]

    def sorted_items(self) -> list[tuple[int, PartitionRegistration]]:
        """``(partition id, registration)`` pairs by id."""
        out: list[tuple[int, PartitionRegistration]] = []
        for ci in sorted(self._chunks):
            chunk = self._chunks[ci]
            out += sorted(chunk.items(), key=_first)
        return out

    def sorted_columns(self) -> tuple[list[int], list[PartitionRegistration]]:
        """Partition ids ascending, and their registrations in the same order (what a topic's
        digest and snapshot frame pack), without a pair per partition."""
        in_order = [self._chunks[ci] for ci in sorted(self._chunks)]
        ids = list(chain.from_iterable(in_order))
        if ids == sorted(ids):  # the usual case: ids were added in ascending order
            return ids, list(chain.from_iterable([chunk.values() for chunk in in_order]))
        ids.sort()
        return ids, list(map(self.__getitem__, ids))

    def __repr__(self) -> str:
        return f"PartitionMap({dict(self.items())!r})"

    def updated(self, changes: Mapping[int, PartitionRegistration]) -> PartitionMap:
        """A new map with ``changes`` set; this map is not modified."""
        if not changes:
            return self
        highest = max(changes)
        shift = self._shift
        if _shift_for(highest) > shift:  # the ids outgrew small chunks: rebuild once
            merged = dict(self.items())
            merged.update(changes)
            return PartitionMap.of_columns(list(merged), merged.values())
        chunks = dict(self._chunks)
        length = self._len
        lo, hi = min(changes) >> shift, highest >> shift
        if lo == hi:  # common case: every change in one chunk
            old = chunks.get(lo)
            chunk = dict(old) if old else {}
            before = len(chunk)
            chunk.update(changes)
            chunks[lo] = chunk
            return PartitionMap(chunks, length + len(chunk) - before, shift)
        touched: dict[int, dict[int, PartitionRegistration]] = {}
        for pid, reg in changes.items():
            ci = pid >> shift
            target = touched.get(ci)
            if target is None:
                prev = chunks.get(ci)
                target = touched[ci] = chunks[ci] = dict(prev) if prev else {}
            target[pid] = reg
        for ci, chunk in touched.items():
            old = self._chunks.get(ci)
            length += len(chunk) - (len(old) if old else 0)
        return PartitionMap(chunks, length, shift)


PartitionMap.EMPTY = PartitionMap({}, 0)


def sorted_partition_items(
    partitions: Mapping[int, PartitionRegistration],
) -> list[tuple[int, PartitionRegistration]]:
    """``(partition id, registration)`` pairs by id, of a PartitionMap or a plain mapping."""
    if isinstance(partitions, PartitionMap):
        return partitions.sorted_items()
    return sorted(partitions.items(), key=_first)


def sorted_partition_columns(
    partitions: Mapping[int, PartitionRegistration],
) -> tuple[list[int], list[PartitionRegistration]]:
    """(ids ascending, registrations in that order), of a PartitionMap or a plain mapping."""
    if isinstance(partitions, PartitionMap):
        return partitions.sorted_columns()
    ids = sorted(partitions)
    return ids, list(map(partitions.__getitem__, ids))


def as_partition_map(partitions: Mapping[int, PartitionRegistration]) -> PartitionMap:
    """``partitions`` as a PartitionMap (itself when it is one)."""
    return partitions if isinstance(partitions, PartitionMap) else PartitionMap.of(partitions)


def partition_chunks(
    partitions: Mapping[int, PartitionRegistration],
) -> list[Mapping[int, PartitionRegistration]]:
    """Mappings that together hold ``partitions``, in :meth:`PartitionMap.items` order: a
    PartitionMap's chunks, or a plain mapping itself."""
    if isinstance(partitions, PartitionMap):
        return list(partitions.chunks())
    return [partitions]
