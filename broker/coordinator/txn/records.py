"""Kafka's ``__transaction_state`` record schemas, so the bytes on disk are Kafka's.

Key: TransactionLogKey v0 (int16 version 0, transactional id). Value: TransactionLogValue v0
(producer id, producer epoch, transaction timeout, status as int8, the partitions of the
transaction grouped by topic, last update and start timestamps). A null value is a tombstone.
Status codes are Kafka's: Empty 0, Ongoing 1, PrepareCommit 2, PrepareAbort 3,
CompleteCommit 4, CompleteAbort 5, Dead 6, PrepareEpochFence 7.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

EMPTY, ONGOING, PREPARE_COMMIT, PREPARE_ABORT = 0, 1, 2, 3
COMPLETE_COMMIT, COMPLETE_ABORT, DEAD, PREPARE_EPOCH_FENCE = 4, 5, 6, 7
STATE_NAMES = {
    EMPTY: "Empty",
    ONGOING: "Ongoing",
    PREPARE_COMMIT: "PrepareCommit",
    PREPARE_ABORT: "PrepareAbort",
    COMPLETE_COMMIT: "CompleteCommit",
    COMPLETE_ABORT: "CompleteAbort",
    DEAD: "Dead",
    PREPARE_EPOCH_FENCE: "PrepareEpochFence",
}


class TxnRecordError(ValueError):
    """Bytes that are not a known ``__transaction_state`` key or value."""


@dataclass(frozen=True, slots=True)
class TxnKey:
    transactional_id: str


@dataclass(frozen=True, slots=True)
class TxnValue:
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: int
    partitions: tuple[tuple[str, int], ...]
    last_update_ms: int
    start_ms: int


TxnRecord = tuple[TxnKey, TxnValue | None]


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def encode_key(key: TxnKey) -> bytes:
    return struct.pack(">h", 0) + _str(key.transactional_id)


def encode_value(value: TxnValue | None) -> bytes | None:
    if value is None:
        return None
    by_topic: dict[str, list[int]] = {}
    for topic, pid in sorted(value.partitions):
        by_topic.setdefault(topic, []).append(pid)
    out = bytearray(
        struct.pack(
            ">hqhib",
            0,
            value.producer_id,
            value.producer_epoch,
            value.timeout_ms,
            value.state,
        )
    )
    out += struct.pack(">i", len(by_topic))
    for topic, pids in by_topic.items():
        out += _str(topic) + struct.pack(f">i{len(pids)}i", len(pids), *pids)
    out += struct.pack(">qq", value.last_update_ms, value.start_ms)
    return bytes(out)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, fmt: str) -> tuple[int, ...]:
        try:
            vals = struct.unpack_from(fmt, self.data, self.pos)
        except struct.error:
            raise TxnRecordError("truncated record") from None
        self.pos += struct.calcsize(fmt)
        return vals

    def string(self) -> str:
        (n,) = self.take(">h")
        if n < 0 or self.pos + n > len(self.data):
            raise TxnRecordError("bad string length")
        s = self.data[self.pos : self.pos + n].decode("utf-8", "replace")
        self.pos += n
        return s


def decode_record(key: bytes, value: bytes | None) -> TxnRecord:
    """The (key, value) of a ``__transaction_state`` record; :class:`TxnRecordError` if unknown."""
    r = _Reader(key)
    (version,) = r.take(">h")
    if version != 0:
        raise TxnRecordError(f"unknown transaction log key version {version}")
    k = TxnKey(r.string())
    if value is None:
        return k, None
    r = _Reader(value)
    (vversion,) = r.take(">h")
    if vversion != 0:
        raise TxnRecordError(f"unknown transaction log value version {vversion}")
    pid, epoch, timeout, state = r.take(">qhib")
    (ntopics,) = r.take(">i")
    parts: list[tuple[str, int]] = []
    for _ in range(max(0, ntopics)):
        topic = r.string()
        (n,) = r.take(">i")
        parts += [(topic, p) for p in r.take(f">{max(0, n)}i")]
    last_update, start = r.take(">qq")
    return k, TxnValue(pid, epoch, timeout, state, tuple(parts), last_update, start)
