"""Hand-written wire format of the data-plane APIs: Produce (v3–9), Fetch (v4–12), ListOffsets
(v1–7) and OffsetForLeaderEpoch (v2–4).

Requests are decoded leniently (unknown tagged fields skipped, trailing bytes ignored) and the
hot responses are encoded directly into a ``bytearray`` — kio's encoder is too slow for record
payloads. The follower fetcher speaks the same APIs as a client (Fetch v11, OffsetForLeaderEpoch
v3, both non-flexible), so the request encoders and response decoders it needs live here too.
Record batches travel as opaque ``bytes``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from broker.protocol.kafka_codec import DecodeError, Reader

API_LIST_OFFSETS, API_OFFSET_FOR_LEADER_EPOCH = 2, 23
PRODUCE_VERSIONS, FETCH_VERSIONS = (3, 9), (4, 12)
LIST_OFFSETS_VERSIONS, OFFSET_FOR_LEADER_EPOCH_VERSIONS = (1, 7), (2, 4)
FLEXIBLE_FROM = {0: 9, 1: 12, API_LIST_OFFSETS: 6, API_OFFSET_FOR_LEADER_EPOCH: 4}
FOLLOWER_FETCH_VERSION, FOLLOWER_EPOCH_VERSION = 11, 3


class Writer:
    """Appends Kafka primitive types to a ``bytearray``."""

    __slots__ = ("buf", "flexible")

    def __init__(self, flexible: bool = False) -> None:
        self.buf = bytearray()
        self.flexible = flexible

    def int8(self, v: int) -> None:
        self.buf += struct.pack(">b", v)

    def int16(self, v: int) -> None:
        self.buf += struct.pack(">h", v)

    def int32(self, v: int) -> None:
        self.buf += struct.pack(">i", v)

    def int64(self, v: int) -> None:
        self.buf += struct.pack(">q", v)

    def uvarint(self, v: int) -> None:
        while v >= 0x80:
            self.buf.append((v & 0x7F) | 0x80)
            v >>= 7
        self.buf.append(v)

    def string(self, s: str | None) -> None:
        if s is None:
            self.uvarint(0) if self.flexible else self.int16(-1)
            return
        b = s.encode()
        self.uvarint(len(b) + 1) if self.flexible else self.int16(len(b))
        self.buf += b

    def nbytes(self, b: bytes | None) -> None:
        """Nullable bytes (record sets)."""
        if b is None:
            self.uvarint(0) if self.flexible else self.int32(-1)
            return
        self.uvarint(len(b) + 1) if self.flexible else self.int32(len(b))
        self.buf += b

    def array(self, n: int | None) -> None:
        if n is None:
            self.uvarint(0) if self.flexible else self.int32(-1)
        else:
            self.uvarint(n + 1) if self.flexible else self.int32(n)

    def tags(self) -> None:
        if self.flexible:
            self.buf.append(0)


def _str(r: Reader, flexible: bool) -> str:
    s = r.compact_string() if flexible else r.string()
    if s is None:
        raise DecodeError("null string where a name is required")
    return s


def _nbytes(r: Reader, flexible: bool) -> bytes | None:
    n = r.uvarint() - 1 if flexible else r.int32()
    if n < 0:
        return None
    return r.take(n)


def _tags(r: Reader, flexible: bool) -> None:
    if flexible:
        r.skip_tags()


# ---- Produce -----------------------------------------------------------------------------------


@dataclass(slots=True)
class ProduceRequest:
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topics: list[tuple[str, list[tuple[int, bytes | None]]]]


def read_produce(version: int, r: Reader) -> ProduceRequest:
    fx = version >= FLEXIBLE_FROM[0]
    txn = r.compact_string() if fx else r.string()
    acks, timeout = r.int16(), r.int32()
    topics = []
    for _ in range(max(0, r.array_len(fx))):
        name = _str(r, fx)
        parts = []
        for _ in range(max(0, r.array_len(fx))):
            idx = r.int32()
            parts.append((idx, _nbytes(r, fx)))
            _tags(r, fx)
        _tags(r, fx)
        topics.append((name, parts))
    return ProduceRequest(txn, acks, timeout, topics)


@dataclass(slots=True)
class PartitionProduceResult:
    partition: int
    error_code: int
    base_offset: int = -1
    log_start_offset: int = -1
    error_message: str | None = None


def write_produce_response(
    version: int, results: list[tuple[str, list[PartitionProduceResult]]]
) -> bytes:
    fx = version >= FLEXIBLE_FROM[0]
    w = Writer(fx)
    w.array(len(results))
    for name, parts in results:
        w.string(name)
        w.array(len(parts))
        for p in parts:
            w.int32(p.partition)
            w.int16(p.error_code)
            w.int64(p.base_offset)
            w.int64(-1)  # log_append_time_ms: CreateTime topics
            if version >= 5:
                w.int64(p.log_start_offset)
            if version >= 8:
                w.array(0)  # record_errors
                w.string(p.error_message)
            w.tags()
        w.tags()
    w.int32(0)  # throttle_time_ms
    w.tags()
    return bytes(w.buf)


# ---- Fetch -------------------------------------------------------------------------------------


@dataclass(slots=True)
class FetchPartition:
    partition: int
    current_leader_epoch: int
    fetch_offset: int
    log_start_offset: int
    max_bytes: int


@dataclass(slots=True)
class FetchRequest:
    replica_id: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation_level: int
    topics: list[tuple[str, list[FetchPartition]]]
    session_id: int = 0
    session_epoch: int = -1  # -1: no session (FINAL_EPOCH); 0: full fetch opening one
    forgotten: list[tuple[str, list[int]]] = field(default_factory=list)


def read_fetch(version: int, r: Reader) -> FetchRequest:
    fx = version >= FLEXIBLE_FROM[1]
    replica_id, max_wait, min_bytes, max_bytes = r.int32(), r.int32(), r.int32(), r.int32()
    isolation = r.int8()
    session_id, session_epoch = (r.int32(), r.int32()) if version >= 7 else (0, -1)
    topics = []
    for _ in range(max(0, r.array_len(fx))):
        name = _str(r, fx)
        parts = []
        for _ in range(max(0, r.array_len(fx))):
            pid = r.int32()
            epoch = r.int32() if version >= 9 else -1
            offset = r.int64()
            if version >= 12:
                r.int32()  # last_fetched_epoch: followers truncate via OffsetForLeaderEpoch
            log_start = r.int64() if version >= 5 else -1
            parts.append(FetchPartition(pid, epoch, offset, log_start, r.int32()))
            _tags(r, fx)
        _tags(r, fx)
        topics.append((name, parts))
    forgotten = []
    if version >= 7:
        for _ in range(max(0, r.array_len(fx))):
            name = _str(r, fx)
            forgotten.append((name, [r.int32() for _ in range(max(0, r.array_len(fx)))]))
            _tags(r, fx)
    # rack id and tags are not needed: this broker has no preferred read replicas
    return FetchRequest(
        replica_id,
        max_wait,
        min_bytes,
        max_bytes,
        isolation,
        topics,
        session_id,
        session_epoch,
        forgotten,
    )


@dataclass(slots=True)
class FetchPartitionResult:
    partition: int
    error_code: int
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: bytes | None = None
    aborted: list[tuple[int, int]] | None = None  # read_committed: (producer id, first offset)


def write_fetch_response(
    version: int,
    error_code: int,
    results: list[tuple[str, list[FetchPartitionResult]]],
    session_id: int = 0,
) -> bytes:
    fx = version >= FLEXIBLE_FROM[1]
    w = Writer(fx)
    w.int32(0)  # throttle_time_ms
    if version >= 7:
        w.int16(error_code)
        w.int32(session_id)
    w.array(len(results))
    for name, parts in results:
        w.string(name)
        w.array(len(parts))
        for p in parts:
            w.int32(p.partition)
            w.int16(p.error_code)
            w.int64(p.high_watermark)
            w.int64(p.last_stable_offset)
            if version >= 5:
                w.int64(p.log_start_offset)
            if version >= 4:
                if p.aborted is None:
                    w.array(None)
                else:
                    w.array(len(p.aborted))
                    for producer_id, first_offset in p.aborted:
                        w.int64(producer_id)
                        w.int64(first_offset)
                        w.tags()
            if version >= 11:
                w.int32(-1)  # preferred read replica
            w.nbytes(p.records if p.records is not None else b"")
            w.tags()
        w.tags()
    w.tags()
    return bytes(w.buf)


def write_fetch_request(req: FetchRequest, version: int = FOLLOWER_FETCH_VERSION) -> bytes:
    """A Fetch request body (non-flexible versions 9–11), as the follower fetcher sends it."""
    assert 9 <= version < FLEXIBLE_FROM[1]
    w = Writer()
    for v in (req.replica_id, req.max_wait_ms, req.min_bytes, req.max_bytes):
        w.int32(v)
    w.int8(req.isolation_level)
    w.int32(req.session_id)
    w.int32(req.session_epoch)
    w.array(len(req.topics))
    for name, parts in req.topics:
        w.string(name)
        w.array(len(parts))
        for p in parts:
            w.int32(p.partition)
            w.int32(p.current_leader_epoch)
            w.int64(p.fetch_offset)
            w.int64(p.log_start_offset)
            w.int32(p.max_bytes)
    w.array(len(req.forgotten))
    for name, pids in req.forgotten:
        w.string(name)
        w.array(len(pids))
        for pid in pids:
            w.int32(pid)
    if version >= 11:
        w.string("")  # rack id
    return bytes(w.buf)


def read_fetch_response(
    version: int, r: Reader
) -> tuple[int, list[tuple[str, list[FetchPartitionResult]]]]:
    """Decode a (non-flexible, v7+) Fetch response body: (top-level error, per-topic results)."""
    error, _, out = read_fetch_session_response(version, r)
    return error, out


def read_fetch_session_response(
    version: int, r: Reader
) -> tuple[int, int, list[tuple[str, list[FetchPartitionResult]]]]:
    """Decode a (non-flexible, v7+) Fetch response body: (top-level error, session id,
    per-topic results)."""
    r.int32()
    error = r.int16()
    session_id = r.int32()
    out = []
    for _ in range(max(0, r.array_len(False))):
        name = _str(r, False)
        parts = []
        for _ in range(max(0, r.array_len(False))):
            pid, err = r.int32(), r.int16()
            hw, lso, lstart = r.int64(), r.int64(), r.int64()
            for _ in range(max(0, r.array_len(False))):
                r.take(16)
            if version >= 11:
                r.int32()
            parts.append(FetchPartitionResult(pid, err, hw, lso, lstart, _nbytes(r, False)))
        out.append((name, parts))
    return error, session_id, out


# ---- ListOffsets -------------------------------------------------------------------------------


@dataclass(slots=True)
class ListOffsetsRequest:
    replica_id: int
    isolation_level: int
    topics: list[
        tuple[str, list[tuple[int, int, int]]]
    ]  # (partition, current leader epoch, timestamp)


def read_list_offsets(version: int, r: Reader) -> ListOffsetsRequest:
    fx = version >= FLEXIBLE_FROM[API_LIST_OFFSETS]
    replica_id = r.int32()
    isolation = r.int8() if version >= 2 else 0
    topics = []
    for _ in range(max(0, r.array_len(fx))):
        name = _str(r, fx)
        parts = []
        for _ in range(max(0, r.array_len(fx))):
            pid = r.int32()
            epoch = r.int32() if version >= 4 else -1
            parts.append((pid, epoch, r.int64()))
            _tags(r, fx)
        _tags(r, fx)
        topics.append((name, parts))
    return ListOffsetsRequest(replica_id, isolation, topics)


def write_list_offsets_response(
    version: int, results: list[tuple[str, list[tuple[int, int, int, int, int]]]]
) -> bytes:
    """results: per topic, (partition, error code, timestamp, offset, leader epoch)."""
    fx = version >= FLEXIBLE_FROM[API_LIST_OFFSETS]
    w = Writer(fx)
    if version >= 2:
        w.int32(0)
    w.array(len(results))
    for name, parts in results:
        w.string(name)
        w.array(len(parts))
        for pid, err, ts, offset, epoch in parts:
            w.int32(pid)
            w.int16(err)
            w.int64(ts)
            w.int64(offset)
            if version >= 4:
                w.int32(epoch)
            w.tags()
        w.tags()
    w.tags()
    return bytes(w.buf)


# ---- OffsetForLeaderEpoch ----------------------------------------------------------------------


@dataclass(slots=True)
class EpochRequest:
    replica_id: int
    topics: list[
        tuple[str, list[tuple[int, int, int]]]
    ]  # (partition, current leader epoch, leader epoch)


def read_offset_for_leader_epoch(version: int, r: Reader) -> EpochRequest:
    fx = version >= FLEXIBLE_FROM[API_OFFSET_FOR_LEADER_EPOCH]
    replica_id = r.int32() if version >= 3 else -2
    topics = []
    for _ in range(max(0, r.array_len(fx))):
        name = _str(r, fx)
        parts = []
        for _ in range(max(0, r.array_len(fx))):
            parts.append((r.int32(), r.int32(), r.int32()))
            _tags(r, fx)
        _tags(r, fx)
        topics.append((name, parts))
    return EpochRequest(replica_id, topics)


def write_offset_for_leader_epoch_request(req: EpochRequest) -> bytes:
    """OffsetForLeaderEpoch v3 request body, as the follower fetcher sends it."""
    w = Writer()
    w.int32(req.replica_id)
    w.array(len(req.topics))
    for name, parts in req.topics:
        w.string(name)
        w.array(len(parts))
        for pid, current, epoch in parts:
            w.int32(pid)
            w.int32(current)
            w.int32(epoch)
    return bytes(w.buf)


def write_offset_for_leader_epoch_response(
    version: int, results: list[tuple[str, list[tuple[int, int, int, int]]]]
) -> bytes:
    """results: per topic, (partition, error code, leader epoch, end offset)."""
    fx = version >= FLEXIBLE_FROM[API_OFFSET_FOR_LEADER_EPOCH]
    w = Writer(fx)
    w.int32(0)
    w.array(len(results))
    for name, parts in results:
        w.string(name)
        w.array(len(parts))
        for pid, err, epoch, end in parts:
            w.int16(err)
            w.int32(pid)
            w.int32(epoch)
            w.int64(end)
            w.tags()
        w.tags()
    w.tags()
    return bytes(w.buf)


def read_offset_for_leader_epoch_response(
    r: Reader,
) -> list[tuple[str, list[tuple[int, int, int, int]]]]:
    """Decode a v3 response body: per topic, (partition, error code, leader epoch, end offset)."""
    r.int32()
    out = []
    for _ in range(max(0, r.array_len(False))):
        name = _str(r, False)
        parts = []
        for _ in range(max(0, r.array_len(False))):
            err, pid, epoch = r.int16(), r.int32(), r.int32()
            parts.append((pid, err, epoch, r.int64()))
        out.append((name, parts))
    return out


def frame_request(
    api_key: int, version: int, correlation_id: int, client_id: str, body: bytes
) -> bytes:
    """A size-prefixed request with header v1 (non-flexible versions only)."""
    cid = client_id.encode()
    head = struct.pack(">hhih", api_key, version, correlation_id, len(cid)) + cid
    return struct.pack(">i", len(head) + len(body)) + head + body


def frame_raw_response(correlation_id: int, body: bytes, flexible: bool) -> bytes:
    """A size-prefixed response: header v0 (v1 with an empty tag section when flexible), body."""
    head = struct.pack(">i", correlation_id) + (b"\x00" if flexible else b"")
    return struct.pack(">i", len(head) + len(body)) + head + body
