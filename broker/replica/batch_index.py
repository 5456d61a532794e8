"""The ``%020d.bindex`` file of a flushed segment: every batch's index entry, so opening the log
reads this instead of parsing the segment batch by batch.

Layout: magic ``PBI1``, then ``<qqi`` (segment base offset, segment size in bytes, entry count),
the entries (:data:`ENTRY`, one per batch, the fields of ``partition_log.BatchInfo`` in order),
and a CRC32C of everything before it. Pure: bytes in, bytes or tuples out.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Any

import crc32c

MAGIC = b"PBI1"
INDEX_SUFFIX = ".bindex"
# base offset, last offset, position, size, max timestamp, leader epoch, producer id,
# producer epoch, base sequence, transactional, control type
ENTRY = struct.Struct("<qqqiqiqhi?b")
_HEAD = struct.Struct("<4sqqi")


class IndexMismatch(ValueError):
    """An index that does not describe the segment at hand (damaged, stale, other segment)."""


def encode_index(base_offset: int, size: int, entries: Sequence[Iterable[Any]]) -> bytes:
    """The index file of a segment of ``size`` bytes starting at ``base_offset``."""
    body = bytearray(_HEAD.pack(MAGIC, base_offset, size, len(entries)))
    pack = ENTRY.pack
    body += b"".join(pack(*e) for e in entries)
    body += struct.pack("<I", crc32c.crc32c(body))
    return bytes(body)


def decode_index(data: bytes, base_offset: int, size: int) -> Iterable[tuple[Any, ...]]:
    """The entries of an index file, checked against the segment's base offset and current
    size; :class:`IndexMismatch` says why it cannot be used."""
    if len(data) < _HEAD.size + 4:
        raise IndexMismatch(f"{len(data)} bytes is too short")
    (crc,) = struct.unpack_from("<I", data, len(data) - 4)
    view = memoryview(data)[:-4]
    if crc32c.crc32c(view) != crc:
        raise IndexMismatch("CRC mismatch")
    magic, base, indexed_size, count = _HEAD.unpack_from(view)
    if magic != MAGIC:
        raise IndexMismatch(f"magic {magic!r}")
    if base != base_offset:
        raise IndexMismatch(f"base offset {base}, segment's is {base_offset}")
    if indexed_size != size:
        raise IndexMismatch(f"indexes {indexed_size} bytes, the segment has {size}")
    entries = view[_HEAD.size :]
    if len(entries) != count * ENTRY.size:
        raise IndexMismatch(f"{len(entries)} bytes of entries for {count}")
    return ENTRY.iter_unpack(entries)
