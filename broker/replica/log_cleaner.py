"""The log cleaner's pure part: which records of a compacted log's cleanable range to keep.

Kafka's rules for ``cleanup.policy=compact`` (``LogCleaner``), on already-parsed batches:

* only the range handed in is cleaned (the caller passes whole closed segments below the last
  stable offset: never the active segment, never an unfinished transaction);
* a keyed record is kept only if it is the latest record of its key in the range; a tombstone
  (null value) that is the latest of its key is kept until its batch is older than
  ``delete.retention.ms``, then removed;
* offsets never change: a batch keeps its base offset and last offset delta (so its producer
  sequence range), and loses records in the middle, leaving gaps readers skip;
* transactions: records of an aborted transaction (an abort marker for the producer follows
  them in the range) are removed and never hide an older record of their key; records whose
  marker is not in the range are kept and hide nothing; a marker is kept while any record of
  its transaction is still in the log, and after that until ``delete.retention.ms``;
* the last batch of each producer the log's producer state still tracks is kept (emptied of
  records if need be), so the idempotent producer state can be rebuilt from the log;
* the first batch of the log is kept (maybe empty) so the log start offset does not move;
* compressed batches are kept whole and their keys hide nothing (decompressing them would need
  every codec); records without a key are kept.

No I/O and no clock: bytes in, decisions and bytes out.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import crc32c

from broker.replica.control_batch import varint_at

HEADER_BYTES = 61
ATTR_COMPRESSION = 0x07
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20


@dataclass(frozen=True, slots=True)
class Record:
    """One record of a batch: its offset, key (None: no key), whether the value is null, and
    where its bytes (length varint included) lie in the batch."""

    offset: int
    key: bytes | None
    tombstone: bool
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Batch:
    """One batch of the cleanable range, as the planner sees it."""

    base_offset: int
    last_offset: int
    max_timestamp: int
    producer_id: int
    transactional: bool
    control: bool
    control_type: int  # a marker's type (0 abort, 1 commit); -1 data or unreadable
    compressed: bool
    records: tuple[Record, ...]  # empty for compressed and control batches


DROP = "drop"
KEEP = "keep"
FILTER = "filter"


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with one batch: ``drop`` it, ``keep`` it byte for byte, or ``filter`` it down
    to the records at ``keep_offsets`` (possibly none: an empty batch kept for its header)."""

    action: str
    keep_offsets: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class Plan:
    decisions: tuple[Decision, ...]
    records_removed: int
    batches_removed: int


def parse_batch(data: bytes | memoryview) -> Batch:
    """The planner's view of one whole v2 batch (``data`` holds exactly that batch)."""
    base, _length = struct.unpack_from(">qi", data, 0)
    (attrs, last_delta) = struct.unpack_from(">hi", data, 21)
    max_ts, producer_id = struct.unpack_from(">qq", data, 35)
    (count,) = struct.unpack_from(">i", data, 57)
    compressed = bool(attrs & ATTR_COMPRESSION)
    control = bool(attrs & ATTR_CONTROL)
    records: list[Record] = []
    control_type = -1
    if control:
        control_type = _marker_type(data, count)
    elif not compressed:
        pos = HEADER_BYTES
        for _ in range(count):
            start = pos
            length, pos = varint_at(data, pos)
            end = pos + length
            pos += 1  # attributes
            _, pos = varint_at(data, pos)  # timestamp delta
            delta, pos = varint_at(data, pos)
            klen, pos = varint_at(data, pos)
            key = None if klen < 0 else bytes(data[pos : pos + klen])
            pos += max(klen, 0)
            vlen, pos = varint_at(data, pos)
            records.append(Record(base + delta, key, vlen < 0, start, end))
            pos = end
    return Batch(
        base,
        base + last_delta,
        max_ts,
        producer_id,
        bool(attrs & ATTR_TRANSACTIONAL),
        control,
        control_type,
        compressed,
        tuple(records),
    )


def _marker_type(data: bytes | memoryview, count: int) -> int:
    if count < 1:
        return -1
    pos = HEADER_BYTES
    _, pos = varint_at(data, pos)  # length
    pos += 1
    _, pos = varint_at(data, pos)  # timestamp delta
    _, pos = varint_at(data, pos)  # offset delta
    klen, pos = varint_at(data, pos)
    if klen < 4:
        return -1
    (kind,) = struct.unpack_from(">h", data, pos + 2)
    return int(kind) if kind in (0, 1) else -1


def _transactions(batches: list[Batch]) -> tuple[dict[int, int], dict[int, list[int]]]:
    """Each transactional data batch's fate: batch index -> marker index (the marker closing
    its transaction in the range), and marker index -> its data batches' indexes. Batches
    whose marker is not in the range are in neither."""
    open_: dict[int, list[int]] = {}
    fate: dict[int, int] = {}
    members: dict[int, list[int]] = {}
    for i, b in enumerate(batches):
        if b.producer_id < 0 or not b.transactional:
            continue
        if not b.control:
            open_.setdefault(b.producer_id, []).append(i)
            continue
        data = open_.pop(b.producer_id, [])
        members[i] = data
        for j in data:
            fate[j] = i
    return fate, members


def plan(
    batches: list[Batch],
    now_ms: int,
    delete_retention_ms: int,
    producer_last_offsets: Mapping[int, int],
    first_of_log: bool,
) -> Plan:
    """Decide each batch of the cleanable range (oldest first). ``producer_last_offsets``:
    producer id -> last offset of its newest batch, for the producers the log still tracks;
    ``first_of_log``: the range starts at the log's first batch (kept, maybe empty)."""
    fate, members = _transactions(batches)
    aborted = {
        j
        for m, data in members.items()
        if batches[m].control_type == 0  # abort marker
        for j in data
    }
    latest: dict[bytes, int] = {}  # key -> offset of its latest record that hides older ones
    for i, b in enumerate(batches):
        if b.compressed or b.control or i in aborted:
            continue
        if b.transactional and b.producer_id >= 0 and i not in fate:
            continue  # outcome unknown in this range: hides nothing
        for r in b.records:
            if r.key is not None:
                latest[r.key] = r.offset
    horizon = now_ms - delete_retention_ms
    keep_sets: list[frozenset[int] | None] = []  # None: keep whole
    for i, b in enumerate(batches):
        if b.compressed or b.control:
            keep_sets.append(None)
            continue
        if i in aborted:
            keep_sets.append(frozenset())
            continue
        if b.transactional and b.producer_id >= 0 and i not in fate:
            keep_sets.append(None)
            continue
        if not b.records:  # emptied by an earlier clean: stays only while it must
            keep_sets.append(frozenset())
            continue
        expired = b.max_timestamp < horizon
        keep = frozenset(
            r.offset
            for r in b.records
            if r.key is None or (latest.get(r.key) == r.offset and not (r.tombstone and expired))
        )
        keep_sets.append(None if len(keep) == len(b.records) else keep)

    def stays(j: int) -> bool:  # the batch remains in the log, maybe emptied
        ks = keep_sets[j]
        if ks is None or ks or (j == 0 and first_of_log):
            return True
        return producer_last_offsets.get(batches[j].producer_id) == batches[j].last_offset

    # markers: kept while any batch of their transaction remains, then until the horizon
    for m, data in members.items():
        if not any(stays(j) for j in data) and batches[m].max_timestamp < horizon:
            keep_sets[m] = frozenset()
    decisions: list[Decision] = []
    removed_records = removed_batches = 0
    for i, b in enumerate(batches):
        ks = keep_sets[i]
        if ks is None or (b.control and stays(i)):
            # a marker is never emptied: an empty control batch would read as data
            decisions.append(Decision(KEEP))
        elif stays(i):
            decisions.append(Decision(FILTER, ks))
            removed_records += len(b.records) - len(ks)
        else:
            decisions.append(Decision(DROP))
            removed_records += 1 if b.control else len(b.records)
            removed_batches += 1
    return Plan(tuple(decisions), removed_records, removed_batches)


def filter_batch(data: bytes | memoryview, batch: Batch, keep: Iterable[int]) -> bytes:
    """``data`` (one whole batch) with only the records at offsets ``keep``: same base offset,
    last offset delta, timestamps and producer fields; new record count, length and CRC (kept
    to nothing: an empty batch, which readers skip by its last offset)."""
    wanted = set(keep)
    body = b"".join(bytes(data[r.start : r.end]) for r in batch.records if r.offset in wanted)
    count = sum(1 for r in batch.records if r.offset in wanted)
    head = bytearray(data[:HEADER_BYTES])
    struct.pack_into(">i", head, 8, HEADER_BYTES - 12 + len(body))
    struct.pack_into(">i", head, 57, count)
    tail = bytes(head[21:]) + body
    struct.pack_into(">I", head, 17, crc32c.crc32c(tail))
    return bytes(head[:21]) + tail
