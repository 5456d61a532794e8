"""The partition map: a persistent ``Mapping[int, PartitionRegistration]`` (one topic's
partitions) split into chunks of 1024 ids, so that changing one partition of a
1,000,000-partition topic copies one chunk plus the chunk index."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
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

_CHUNK_SHIFT = 10  # 1024 partition ids per chunk


class PartitionMap(Mapping[int, PartitionRegistration]):
    """An immutable ``Mapping[int, PartitionRegistration]`` stored as chunks of 1024 ids, so that
    :meth:`updated` copies only the chunks it touches (plus the small chunk index)."""

    __slots__ = ("_chunks", "_len")

    EMPTY: ClassVar[PartitionMap]

    def __init__(self, chunks: dict[int, dict[int, PartitionRegistration]], length: int) -> None:
        self._chunks = chunks
        self._len = length

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
        partitions = dict(zip(ids, registrations))
        if not partitions:
            return PartitionMap.EMPTY
        lo, hi = min(partitions) >> _CHUNK_SHIFT, max(partitions) >> _CHUNK_SHIFT
        if lo == hi:
            return PartitionMap({lo: partitions}, len(partitions))
        chunks: dict[int, dict[int, PartitionRegistration]] = {}
        for pid, reg in partitions.items():
            chunk = chunks.get(pid >> _CHUNK_SHIFT)
            if chunk is None:
                chunk = chunks[pid >> _CHUNK_SHIFT] = {}
            chunk[pid] = reg
        return PartitionMap(chunks, len(partitions))

    def __getitem__(self, pid: int) -> PartitionRegistration:
        chunk = self._chunks.get(pid >> _CHUNK_SHIFT)
        if chunk is None:
            raise KeyError(pid)
        return chunk[pid]

    def get(self, pid: int, default: Any = None) -> Any:
        chunk = self._chunks.get(pid >> _CHUNK_SHIFT)
        if chunk is None:
            return default
        return chunk.get(pid, default)

    def __contains__(self, pid: object) -> bool:
        if type(pid) is not int:
            return False
        chunk = self._chunks.get(pid >> _CHUNK_SHIFT)
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
        ids: list[int] = []
        regs: list[PartitionRegistration] = []
        for ci in sorted(self._chunks):
            chunk = self._chunks[ci]
            keys = sorted(chunk)
            ids += keys
            regs += map(chunk.__getitem__, keys)
        return ids, regs

    def __repr__(self) -> str:
        return f"PartitionMap({dict(self.items())!r})"

    def updated(self, changes: Mapping[int, PartitionRegistration]) -> PartitionMap:
        """A new map with ``changes`` set; this map is not modified."""
        if not changes:
            return self
        chunks = dict(self._chunks)
        length = self._len
        lo, hi = min(changes) >> _CHUNK_SHIFT, max(changes) >> _CHUNK_SHIFT
        if lo == hi:  # common case: every change in one chunk
            old = chunks.get(lo)
            chunk = dict(old) if old else {}
            before = len(chunk)
            chunk.update(changes)
            chunks[lo] = chunk
            return PartitionMap(chunks, length + len(chunk) - before)
        touched: dict[int, dict[int, PartitionRegistration]] = {}
        for pid, reg in changes.items():
            ci = pid >> _CHUNK_SHIFT
            target = touched.get(ci)
            if target is None:
                prev = chunks.get(ci)
                target = touched[ci] = chunks[ci] = dict(prev) if prev else {}
            target[pid] = reg
        for ci, chunk in touched.items():
            old = self._chunks.get(ci)
            length += len(chunk) - (len(old) if old else 0)
        return PartitionMap(chunks, length)


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
