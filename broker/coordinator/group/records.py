"""Kafka's ``__consumer_offsets`` record schemas, so the bytes on disk are Kafka's.

Keys start with an int16 version: 0/1 = OffsetCommitKey (group, topic, partition), 2 =
GroupMetadataKey (group). Values: OffsetCommitValue v3 (offset, leader epoch, metadata, commit
timestamp) and GroupMetadataValue v3 (protocol type, generation, protocol, leader, state
timestamp, members with subscription and assignment). A null value is a tombstone. Decoding also
reads OffsetCommitValue v1 (with expire timestamp) and GroupMetadataValue v0-v2.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field


class RecordFormatError(ValueError):
    """Bytes that are not a known ``__consumer_offsets`` key or value."""


@dataclass(frozen=True, slots=True)
class OffsetKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupKey:
    group: str


@dataclass(frozen=True, slots=True)
class OffsetValue:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp: int = -1


@dataclass(frozen=True, slots=True)
class MemberValue:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int
    members: tuple[MemberValue, ...] = field(default_factory=tuple)


# ---- writing -----------------------------------------------------------------------------------


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def _nstr(s: str | None) -> bytes:
    return struct.pack(">h", -1) if s is None else _str(s)


def _bytes(b: bytes) -> bytes:
    return struct.pack(">i", len(b)) + b


def encode_key(key: OffsetKey | GroupKey) -> bytes:
    if isinstance(key, OffsetKey):
        return (
            struct.pack(">h", 1)
            + _str(key.group)
            + _str(key.topic)
            + struct.pack(">i", key.partition)
        )
    return struct.pack(">h", 2) + _str(key.group)


def encode_value(value: OffsetValue | GroupValue | None) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, OffsetValue):
        return (
            struct.pack(">hqi", 3, value.offset, value.leader_epoch)
            + _str(value.metadata)
            + struct.pack(">q", value.commit_timestamp)
        )
    out = [
        struct.pack(">h", 3),
        _str(value.protocol_type),
        struct.pack(">i", value.generation),
        _nstr(value.protocol),
        _nstr(value.leader),
        struct.pack(">qi", value.current_state_timestamp, len(value.members)),
    ]
    for m in value.members:
        out += [
            _str(m.member_id),
            _nstr(m.group_instance_id),
            _str(m.client_id),
            _str(m.client_host),
            struct.pack(">ii", m.rebalance_timeout, m.session_timeout),
            _bytes(m.subscription),
            _bytes(m.assignment),
        ]
    return b"".join(out)


# ---- reading -----------------------------------------------------------------------------------


class _In:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, fmt: str) -> int:
        try:
            (v,) = struct.unpack_from(fmt, self.data, self.pos)
        except struct.error:
            raise RecordFormatError("truncated record") from None
        self.pos += struct.calcsize(fmt)
        return int(v)

    def nstr(self) -> str | None:
        n = self.take(">h")
        if n < 0:
            return None
        if self.pos + n > len(self.data):
            raise RecordFormatError("truncated string")
        s = self.data[self.pos : self.pos + n].decode("utf-8", "replace")
        self.pos += n
        return s

    def str(self) -> str:
        return self.nstr() or ""

    def bytes(self) -> bytes:
        n = self.take(">i")
        if n < 0:
            return b""
        if self.pos + n > len(self.data):
            raise RecordFormatError("truncated bytes")
        b = self.data[self.pos : self.pos + n]
        self.pos += n
        return bytes(b)


def decode_key(data: bytes) -> OffsetKey | GroupKey:
    r = _In(data)
    version = r.take(">h")
    if version in (0, 1):
        return OffsetKey(r.str(), r.str(), r.take(">i"))
    if version == 2:
        return GroupKey(r.str())
    raise RecordFormatError(f"unknown key version {version}")


def decode_offset_value(data: bytes) -> OffsetValue:
    r = _In(data)
    version = r.take(">h")
    if version not in (0, 1, 2, 3):
        raise RecordFormatError(f"unknown offset value version {version}")
    offset = r.take(">q")
    epoch = r.take(">i") if version >= 3 else -1
    metadata = r.str()
    ts = r.take(">q")
    return OffsetValue(offset, epoch, metadata, ts)


def decode_group_value(data: bytes) -> GroupValue:
    r = _In(data)
    version = r.take(">h")
    if version not in (0, 1, 2, 3):
        raise RecordFormatError(f"unknown group value version {version}")
    protocol_type = r.str()
    generation = r.take(">i")
    protocol, leader = r.nstr(), r.nstr()
    ts = r.take(">q") if version >= 2 else -1
    members = []
    for _ in range(max(0, r.take(">i"))):
        member_id = r.str()
        instance = r.nstr() if version >= 3 else None
        client_id, client_host = r.str(), r.str()
        rebalance = r.take(">i") if version >= 1 else 0
        session = r.take(">i")
        members.append(
            MemberValue(
                member_id,
                instance,
                client_id,
                client_host,
                rebalance or session,
                session,
                r.bytes(),
                r.bytes(),
            )
        )
    return GroupValue(protocol_type, generation, protocol, leader, ts, tuple(members))


Record = tuple[OffsetKey | GroupKey, OffsetValue | GroupValue | None]


def decode_record(key: bytes, value: bytes | None) -> Record:
    """One (key, value) pair read from the log; value None is a tombstone."""
    k = decode_key(key)
    if value is None:
        return k, None
    return k, decode_offset_value(value) if isinstance(k, OffsetKey) else decode_group_value(value)
