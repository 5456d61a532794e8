"""Kafka's ``__consumer_offsets`` records of consumer-protocol (KIP-848) groups, byte for byte.

Keys are non-flexible and start with an int16 record type: 3 ConsumerGroupMetadata (group),
4 ConsumerGroupPartitionMetadata (group), 5 ConsumerGroupMemberMetadata (group, member),
6 ConsumerGroupTargetAssignmentMetadata (group), 7 ConsumerGroupTargetAssignmentMember (group,
member), 8 ConsumerGroupCurrentMemberAssignment (group, member). Values are flexible version 0
(compact strings and arrays, tagged fields, read and skipped); a null value is a tombstone.
Types 0-2 (offsets, classic groups) are :mod:`broker.coordinator.group.records`, and
:func:`decode_any` / :func:`encode_any` handle both families.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from typing import Any

from broker.coordinator.group import records as classic
from broker.coordinator.group.records import RecordFormatError

# A member's partitions: (topic id, sorted partitions), sorted by topic id.
Partitions = tuple[tuple[uuid.UUID, tuple[int, ...]], ...]


def partitions_of(mapping: dict[uuid.UUID, Any]) -> Partitions:
    """The canonical (sorted, no empty topics) form of ``{topic id: partitions}``."""
    return tuple(sorted((t, tuple(sorted(ps))) for t, ps in mapping.items() if ps))


# ---- keys ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CGMetadataKey:
    group: str


@dataclass(frozen=True, slots=True)
class CGPartitionMetadataKey:
    group: str


@dataclass(frozen=True, slots=True)
class CGMemberKey:
    group: str
    member_id: str


@dataclass(frozen=True, slots=True)
class CGTargetMetadataKey:
    group: str


@dataclass(frozen=True, slots=True)
class CGTargetMemberKey:
    group: str
    member_id: str


@dataclass(frozen=True, slots=True)
class CGCurrentAssignmentKey:
    group: str
    member_id: str


# ---- values -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CGMetadataValue:
    epoch: int


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    topic_id: uuid.UUID
    name: str
    partitions: int


@dataclass(frozen=True, slots=True)
class CGPartitionMetadataValue:
    topics: tuple[TopicMetadata, ...]


@dataclass(frozen=True, slots=True)
class CGMemberValue:
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    topics: tuple[str, ...]
    regex: str | None
    rebalance_timeout_ms: int
    server_assignor: str | None


@dataclass(frozen=True, slots=True)
class CGTargetMetadataValue:
    assignment_epoch: int


@dataclass(frozen=True, slots=True)
class CGTargetMemberValue:
    partitions: Partitions


@dataclass(frozen=True, slots=True)
class CGCurrentAssignmentValue:
    member_epoch: int
    previous_member_epoch: int
    state: int
    assigned: Partitions
    revoking: Partitions


ConsumerKey = (
    CGMetadataKey
    | CGPartitionMetadataKey
    | CGMemberKey
    | CGTargetMetadataKey
    | CGTargetMemberKey
    | CGCurrentAssignmentKey
)
ConsumerValue = (
    CGMetadataValue
    | CGPartitionMetadataValue
    | CGMemberValue
    | CGTargetMetadataValue
    | CGTargetMemberValue
    | CGCurrentAssignmentValue
)
_TYPE: dict[type, int] = {
    CGMetadataKey: 3,
    CGPartitionMetadataKey: 4,
    CGMemberKey: 5,
    CGTargetMetadataKey: 6,
    CGTargetMemberKey: 7,
    CGCurrentAssignmentKey: 8,
}
CONSUMER_TYPES = frozenset(_TYPE.values())


def is_consumer_key(key: object) -> bool:
    """Is ``key`` one of the consumer-protocol group record keys?"""
    return type(key) in _TYPE


# ---- writing ------------------------------------------------------------------------------------


def uvarint(n: int) -> bytes:
    """An unsigned varint (Kafka's compact lengths and tagged-field counts)."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _cstr(s: str | None) -> bytes:
    if s is None:
        return b"\x00"
    b = s.encode()
    return uvarint(len(b) + 1) + b


def _cparts(parts: Partitions) -> bytes:
    out = [uvarint(len(parts) + 1)]
    for tid, ps in parts:
        out += [tid.bytes, uvarint(len(ps) + 1), struct.pack(f">{len(ps)}i", *ps), b"\x00"]
    return b"".join(out)


_NO_TAGS = b"\x00"


def encode_consumer_key(key: ConsumerKey) -> bytes:
    out = struct.pack(">h", _TYPE[type(key)]) + classic._str(key.group)
    if isinstance(key, CGMemberKey | CGTargetMemberKey | CGCurrentAssignmentKey):
        out += classic._str(key.member_id)
    return out


def encode_consumer_value(value: ConsumerValue) -> bytes:
    head = struct.pack(">h", 0)
    if isinstance(value, CGMetadataValue):
        return head + struct.pack(">i", value.epoch) + _NO_TAGS
    if isinstance(value, CGTargetMetadataValue):
        return head + struct.pack(">i", value.assignment_epoch) + _NO_TAGS
    if isinstance(value, CGPartitionMetadataValue):
        out = [head, uvarint(len(value.topics) + 1)]
        for t in value.topics:
            # PartitionMetadata (racks per partition): empty, as Kafka writes without racks
            out += [t.topic_id.bytes, _cstr(t.name), struct.pack(">i", t.partitions), b"\x01"]
            out.append(_NO_TAGS)
        return b"".join(out) + _NO_TAGS
    if isinstance(value, CGMemberValue):
        out = [head, _cstr(value.instance_id), _cstr(value.rack_id)]
        out += [_cstr(value.client_id), _cstr(value.client_host)]
        out.append(uvarint(len(value.topics) + 1))
        out += [_cstr(t) for t in value.topics]
        out += [_cstr(value.regex), struct.pack(">i", value.rebalance_timeout_ms)]
        out += [_cstr(value.server_assignor), _NO_TAGS]
        return b"".join(out)
    if isinstance(value, CGTargetMemberValue):
        return head + _cparts(value.partitions) + _NO_TAGS
    return (
        head
        + struct.pack(">iib", value.member_epoch, value.previous_member_epoch, value.state)
        + _cparts(value.assigned)
        + _cparts(value.revoking)
        + _NO_TAGS
    )


# ---- reading ------------------------------------------------------------------------------------


class _Flex(classic._In):
    """Reads the flexible (compact) encoding."""

    def uvarint(self) -> int:
        n, shift = 0, 0
        while True:
            if self.pos >= len(self.data):
                raise RecordFormatError("truncated varint")
            b = self.data[self.pos]
            self.pos += 1
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                return n
            shift += 7
            if shift > 35:
                raise RecordFormatError("varint too long")

    def cstr(self) -> str | None:
        n = self.uvarint() - 1
        if n < 0:
            return None
        if self.pos + n > len(self.data):
            raise RecordFormatError("truncated string")
        s = bytes(self.data[self.pos : self.pos + n]).decode("utf-8", "replace")
        self.pos += n
        return s

    def count(self) -> int:
        n = self.uvarint() - 1
        if n > len(self.data):
            raise RecordFormatError("array longer than the record")
        return max(0, n)

    def uuid(self) -> uuid.UUID:
        if self.pos + 16 > len(self.data):
            raise RecordFormatError("truncated uuid")
        u = uuid.UUID(bytes=bytes(self.data[self.pos : self.pos + 16]))
        self.pos += 16
        return u

    def tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.pos += self.uvarint()
        if self.pos > len(self.data):
            raise RecordFormatError("truncated tagged fields")

    def parts(self) -> Partitions:
        out = []
        for _ in range(self.count()):
            tid = self.uuid()
            ps = tuple(self.take(">i") for _ in range(self.count()))
            self.tags()
            out.append((tid, tuple(sorted(ps))))
        return tuple(sorted(out))


def decode_consumer_key(kind: int, r: classic._In) -> ConsumerKey:
    group = r.str()
    if kind == 3:
        return CGMetadataKey(group)
    if kind == 4:
        return CGPartitionMetadataKey(group)
    if kind == 6:
        return CGTargetMetadataKey(group)
    member = r.str()
    if kind == 5:
        return CGMemberKey(group, member)
    if kind == 7:
        return CGTargetMemberKey(group, member)
    return CGCurrentAssignmentKey(group, member)


def decode_consumer_value(key: ConsumerKey, data: bytes) -> ConsumerValue:
    r = _Flex(data)
    version = r.take(">h")
    if version != 0:
        raise RecordFormatError(f"unknown value version {version} of {type(key).__name__}")
    out: ConsumerValue
    if isinstance(key, CGMetadataKey):
        out = CGMetadataValue(r.take(">i"))
    elif isinstance(key, CGTargetMetadataKey):
        out = CGTargetMetadataValue(r.take(">i"))
    elif isinstance(key, CGPartitionMetadataKey):
        topics = []
        for _ in range(r.count()):
            tid, name, n = r.uuid(), r.cstr() or "", r.take(">i")
            for _ in range(r.count()):  # racks per partition: not used
                r.take(">i")
                for _ in range(r.count()):
                    r.cstr()
                r.tags()
            r.tags()
            topics.append(TopicMetadata(tid, name, n))
        out = CGPartitionMetadataValue(tuple(topics))
    elif isinstance(key, CGMemberKey):
        instance, rack = r.cstr(), r.cstr()
        client_id, host = r.cstr() or "", r.cstr() or ""
        names = tuple(r.cstr() or "" for _ in range(r.count()))
        regex, timeout, assignor = r.cstr(), r.take(">i"), r.cstr()
        out = CGMemberValue(instance, rack, client_id, host, names, regex, timeout, assignor)
    elif isinstance(key, CGTargetMemberKey):
        out = CGTargetMemberValue(r.parts())
    else:
        epoch, previous = r.take(">i"), r.take(">i")
        state = r.take(">b")
        out = CGCurrentAssignmentValue(epoch, previous, state, r.parts(), r.parts())
    r.tags()
    return out


# ---- both families ------------------------------------------------------------------------------

AnyKey = classic.OffsetKey | classic.GroupKey | ConsumerKey
AnyValue = classic.OffsetValue | classic.GroupValue | ConsumerValue | None
AnyRecord = tuple[AnyKey, AnyValue]


def decode_any(key: bytes, value: bytes | None) -> AnyRecord:
    """One (key, value) read from ``__consumer_offsets``, whichever group type wrote it."""
    if len(key) < 2:
        raise RecordFormatError("truncated key")
    (kind,) = struct.unpack_from(">h", key, 0)
    if kind not in CONSUMER_TYPES:
        return classic.decode_record(key, value)
    r = classic._In(key)
    r.pos = 2
    k = decode_consumer_key(kind, r)
    return k, None if value is None else decode_consumer_value(k, value)


def encode_any(record: Any) -> tuple[bytes, bytes | None]:
    """The (key, value) bytes of a record of either family."""
    key, value = record
    if is_consumer_key(key):
        return encode_consumer_key(key), None if value is None else encode_consumer_value(value)
    return classic.encode_key(key), classic.encode_value(value)
