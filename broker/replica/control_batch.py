"""Transaction markers: the control batches (Kafka's EndTransactionMarker) a transaction
coordinator has written to each partition of a transaction when it commits or aborts.

A control batch has the transactional and control attribute bits set, the producer id and
epoch of the transaction, base sequence -1, and one record whose key is (int16 version 0,
int16 type: 0 abort, 1 commit) and whose value is (int16 version 0, int32 coordinator epoch).
"""

from __future__ import annotations

import struct

import crc32c

ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20


def _varint(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_marker(
    producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int, timestamp_ms: int
) -> bytes:
    """One control batch (base offset 0: the log assigns it)."""
    key = struct.pack(">hh", 0, 1 if commit else 0)
    value = struct.pack(">hi", 0, coordinator_epoch)
    rec = b"\x00" + _varint(0) + _varint(0) + _varint(len(key)) + key
    rec += _varint(len(value)) + value + _varint(0)
    records = _varint(len(rec)) + rec
    tail = (
        struct.pack(
            ">hiqqqhii",
            ATTR_TRANSACTIONAL | ATTR_CONTROL,
            0,
            timestamp_ms,
            timestamp_ms,
            producer_id,
            producer_epoch,
            -1,
            1,
        )
        + records
    )
    head = struct.pack(">qiibI", 0, 4 + 1 + 4 + len(tail), -1, 2, crc32c.crc32c(tail))
    return head + tail


def marker_type(batch: bytes | memoryview, pos: int, end: int) -> int:
    """The marker type (0 abort, 1 commit) of the control batch at ``pos`` (-1 if unreadable)."""
    p = pos + 61
    try:
        p = _skip_varint(batch, p)  # record length
        p += 1  # attributes
        p = _skip_varint(batch, p)  # timestamp delta
        p = _skip_varint(batch, p)  # offset delta
        p = _skip_varint(batch, p)  # key length (4 for a marker)
        if p + 4 > end:
            return -1
        (kind,) = struct.unpack_from(">h", batch, p + 2)
        return int(kind) if kind in (0, 1) else -1
    except IndexError:
        return -1


def varint_at(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """The zigzag varint of a v2 record at byte ``pos``, and the position after it."""
    shift = n = 0
    while True:
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return (n >> 1) ^ -(n & 1), pos
        shift += 7


def _skip_varint(data: bytes | memoryview, p: int) -> int:
    while data[p] & 0x80:
        p += 1
    return p + 1
