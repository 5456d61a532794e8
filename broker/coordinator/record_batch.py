"""Writing and reading uncompressed magic-2 record batches of (key, value) records: what a
coordinator appends to its internal partition and replays when it loads one. A batch may be
transactional (a producer id and epoch, sequence -1: the group coordinator's TxnOffsetCommit
records, as Kafka writes them); :func:`read_entries` also gives each record's transactional
producer and the transaction markers (control batches), :func:`read_records` skips markers.
Compressed batches are refused (coordinators never write them)."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

import crc32c

from broker.replica.control_batch import varint_at

_ATTR_COMPRESSION = 0x07
_ATTR_TRANSACTIONAL = 0x10
_ATTR_CONTROL = 0x20


class Entry(NamedTuple):
    """One record of a coordinator partition: data (``marker`` None) with the producer id of
    its transaction (-1: not transactional), or a transaction marker (``marker``: True commit,
    False abort) of ``producer_id``."""

    offset: int
    key: bytes | None
    value: bytes | None
    producer_id: int = -1
    marker: bool | None = None


def _varint(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)  # zigzag
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_batch(
    records: list[tuple[bytes, bytes | None]],
    timestamp_ms: int,
    producer: tuple[int, int] | None = None,
) -> bytes:
    """One batch holding ``records`` (base offset 0: the log assigns offsets); ``producer``
    (id, epoch): a transactional batch of that producer (sequence -1)."""
    body = bytearray()
    for i, (key, value) in enumerate(records):
        rec = bytearray(b"\x00")  # attributes
        rec += _varint(0) + _varint(i)  # timestamp delta, offset delta
        rec += _varint(len(key)) + key
        rec += _varint(-1) if value is None else _varint(len(value)) + value
        rec += _varint(0)  # headers
        body += _varint(len(rec)) + rec
    attrs = 0 if producer is None else _ATTR_TRANSACTIONAL
    pid, epoch = producer if producer is not None else (-1, -1)
    tail = struct.pack(
        ">hiqqqhii", attrs, len(records) - 1, timestamp_ms, timestamp_ms, pid, epoch, -1,
        len(records),
    ) + bytes(body)  # fmt: skip
    crc = crc32c.crc32c(tail)
    head = struct.pack(">qiibI", 0, 4 + 1 + 4 + len(tail), -1, 2, crc)
    return head + tail


class _Cursor:
    def __init__(self, data: bytes, pos: int) -> None:
        self.data, self.pos = data, pos

    def varint(self) -> int:
        shift = n = 0
        while True:
            b = self.data[self.pos]
            self.pos += 1
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                return (n >> 1) ^ -(n & 1)
            shift += 7

    def blob(self) -> bytes | None:
        n = self.varint()
        if n < 0:
            return None
        b = self.data[self.pos : self.pos + n]
        self.pos += n
        return bytes(b)


def read_records(data: bytes) -> Iterator[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every data record in ``data`` (whole batches back to back)."""
    for e in read_entries(data):
        if e.marker is None:
            yield e.offset, e.key, e.value


_HEAD = struct.Struct(">qi9xh20xq6xi")  # base offset, length, attributes, producer id, count


def read_entries(data: bytes) -> Iterator[Entry]:
    """Every data record and transaction marker in ``data`` (whole batches back to back).
    The hot loop of a coordinator's load: one-byte varints are decoded inline and a record's
    headers are skipped by its length."""
    if not isinstance(data, bytes):
        data = bytes(data)
    pos, n = 0, len(data)
    head = _HEAD.unpack_from
    while pos + 61 <= n:
        base, length, attrs, producer_id, count = head(data, pos)
        end = pos + 12 + length
        if attrs & _ATTR_CONTROL:
            c = _Cursor(data, pos + 61)
            if count > 0:
                c.varint()  # length
                c.pos += 1  # attributes
                c.varint()  # timestamp delta
                delta = c.varint()
                key = c.blob()
                if key is not None and len(key) >= 4:
                    (kind,) = struct.unpack_from(">h", key, 2)  # version, then 0 abort / 1 commit
                    yield Entry(base + delta, None, None, producer_id, kind == 1)
            pos = end
            continue
        txn_pid = producer_id if attrs & _ATTR_TRANSACTIONAL else -1
        if attrs & _ATTR_COMPRESSION:
            raise ValueError(f"compressed batch at offset {base} in a coordinator partition")
        p = pos + 61
        for _ in range(count):
            b = data[p]
            if b < 0x80:
                size, p = (b >> 1) ^ -(b & 1), p + 1
            else:
                size, p = varint_at(data, p)
            record_end = p + size
            p += 1  # attributes
            if data[p] < 0x80:  # timestamp delta
                p += 1
            else:
                _, p = varint_at(data, p)
            b = data[p]
            if b < 0x80:
                delta, p = (b >> 1) ^ -(b & 1), p + 1
            else:
                delta, p = varint_at(data, p)
            b = data[p]
            if b < 0x80:
                klen, p = (b >> 1) ^ -(b & 1), p + 1
            else:
                klen, p = varint_at(data, p)
            key = None
            if klen >= 0:
                key, p = data[p : p + klen], p + klen
            b = data[p]
            if b < 0x80:
                vlen, p = (b >> 1) ^ -(b & 1), p + 1
            else:
                vlen, p = varint_at(data, p)
            value = None if vlen < 0 else data[p : p + vlen]
            yield Entry(base + delta, key, value, txn_pid)
            p = record_end
        pos = end


def scan_plain(
    data: bytes, pos: int, latest: dict[bytes, tuple[int, bytes | None]]
) -> tuple[int, int]:
    """From byte ``pos``, fold the keyed records of consecutive plain batches (neither
    transactional, control nor compressed) into ``latest`` (key -> (offset, value), re-inserted
    so the order is each key's last occurrence). Stops at the first other batch or the end:
    (its byte position, records folded). The load's hot loop: no generator, no tuple per record
    beyond the dict's."""
    n = len(data)
    head = _HEAD.unpack_from
    special = _ATTR_CONTROL | _ATTR_TRANSACTIONAL | _ATTR_COMPRESSION
    folded = 0
    while pos + 61 <= n:
        base, length, attrs, _, count = head(data, pos)
        if attrs & special:
            break
        p = pos + 61
        for _ in range(count):
            b = data[p]
            if b < 0x80:
                size, p = (b >> 1) ^ -(b & 1), p + 1
            else:
                size, p = varint_at(data, p)
            record_end = p + size
            p += 1  # attributes
            if data[p] < 0x80:  # timestamp delta
                p += 1
            else:
                _, p = varint_at(data, p)
            b = data[p]
            if b < 0x80:
                delta, p = (b >> 1) ^ -(b & 1), p + 1
            else:
                delta, p = varint_at(data, p)
            b = data[p]
            if b < 0x80:
                klen, p = (b >> 1) ^ -(b & 1), p + 1
            else:
                klen, p = varint_at(data, p)
            if klen >= 0:
                key = data[p : p + klen]
                p += klen
                b = data[p]
                if b < 0x80:
                    vlen, p = (b >> 1) ^ -(b & 1), p + 1
                else:
                    vlen, p = varint_at(data, p)
                latest.pop(key, None)
                latest[key] = (base + delta, None if vlen < 0 else data[p : p + vlen])
                folded += 1
            p = record_end
        pos += 12 + length
    return pos, folded


def last_offset(data: bytes) -> int:
    """The last offset of the last whole batch in ``data`` (-1 if none)."""
    pos, last, n = 0, -1, len(data)
    while pos + 61 <= n:
        base, length = struct.unpack_from(">qi", data, pos)
        (delta,) = struct.unpack_from(">i", data, pos + 23)
        if pos + 12 + length > n:
            break
        last, pos = base + delta, pos + 12 + length
    return last
