"""Every metadata record type pykraft writes, its msgpack codec, and the batch that carries them.

A record is a msgpack map ``{"type": id, "version": v, <field>: <value>, ...}`` with its fields
in a fixed order, so the same record always encodes to the same bytes. A :class:`Batch` is the
unit appended to the metadata log: its base offset, the Raft term and index of the command that
produced it (and the command's position inside that Raft entry, since entries group commands), the time the active controller stamped on that command, its records, who asked and
why (:class:`Provenance`), and the hash of the previous batch's encoding (a hash chain the audit
uses to prove that history was not edited).

Decoding is strict: an unknown type or version, a missing, extra or wrongly typed field raises
:class:`RecordDecodeError` naming what is wrong — never a silent skip.

This module is the one codec shared by the controller, the broker, the CLI and the Spark audit.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar, dataclass_transform

import msgpack

from kraft.slots import slot_init

# ---------------------------------------------------------------------------------------------
# Field kinds: a validator per kind. Each returns the (possibly normalised) value or raises.
# ---------------------------------------------------------------------------------------------


class RecordDecodeError(ValueError):
    """A record or batch that cannot be decoded: unknown type/version, bad or missing field."""


def _int(v: Any) -> int:
    if type(v) is not int:  # bool is an int subclass: refuse it
        raise TypeError("expected an integer")
    return v


def _str(v: Any) -> str:
    if type(v) is not str:
        raise TypeError("expected a string")
    return v


def _bool(v: Any) -> bool:
    if type(v) is not bool:
        raise TypeError("expected a boolean")
    return v


def _ints(v: Any) -> tuple[int, ...]:
    if type(v) not in (list, tuple):
        raise TypeError("expected a list of integers")
    for x in v:
        if type(x) is not int:
            raise TypeError("expected a list of integers")
    return tuple(v)


def _optional(kind: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        return None if v is None else kind(v)

    return check


Kind = Callable[[Any], Any]
Map = dict[str, Any]


def _maps(spec: dict[str, Kind]) -> Callable[[Any], tuple[Map, ...]]:
    def check(v: Any) -> tuple[Map, ...]:
        if type(v) not in (list, tuple):
            raise TypeError("expected a list of maps")
        out = []
        for item in v:
            if not isinstance(item, dict) or set(item) != set(spec):
                raise TypeError(f"expected maps with keys {sorted(spec)}")
            out.append({k: spec[k](item[k]) for k in spec})
        return tuple(out)

    check.keys = tuple(spec)  # type: ignore[attr-defined]  # canonical key order on encode
    return check


INT, STR, BOOL, INTS = _int, _str, _bool, _ints
OPT_STR, OPT_INT, OPT_INTS = _optional(_str), _optional(_int), _optional(_ints)
ENDPOINTS = _maps({"name": _str, "host": _str, "port": _int, "security_protocol": _str})
FEATURES = _maps({"name": _str, "min_version": _int, "max_version": _int})

# ---------------------------------------------------------------------------------------------
# Record base and registry
# ---------------------------------------------------------------------------------------------

RECORD_TYPES: dict[int, type[Record]] = {}


class Record:
    """Base of every metadata record. Subclasses are frozen dataclasses registered by type id."""

    TYPE: ClassVar[int]
    VERSION: ClassVar[int] = 0
    NAME: ClassVar[str]
    FIELDS: ClassVar[tuple[tuple[str, Kind], ...]]
    __dataclass_fields__: ClassVar[dict[str, Any]]  # every record is a dataclass

    @staticmethod
    def _kinds() -> dict[str, Kind]:
        """Each field's kind (validator), in field order; every subclass defines it."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """The record as the msgpack map that is written: type, version, then fields in order."""
        d: dict[str, Any] = {"type": self.TYPE, "version": self.VERSION}
        for name, kind in self.FIELDS:
            value = getattr(self, name)
            keys = getattr(kind, "keys", None)
            if keys is not None:  # maps inside lists: always encode their keys in spec order
                value = [{k: item[k] for k in keys} for item in value]
            d[name] = value
        return d

    def encode(self) -> bytes:
        return _packb(self.to_dict())


def _packb(obj: object) -> bytes:
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


R = TypeVar("R", bound=Record)


@dataclass_transform(frozen_default=True)
def record_type(type_id: int, version: int = 0) -> Callable[[type[R]], type[R]]:
    """Register a record class under ``type_id`` as a frozen, slotted dataclass; field kinds
    come from ``_kinds``. ``dataclass_transform`` tells type checkers the fields and
    ``__init__`` this makes."""

    def wrap(cls: type[R]) -> type[R]:
        if type_id in RECORD_TYPES:
            raise RuntimeError(f"record type id {type_id} registered twice")
        cls = dataclass(frozen=True, slots=True)(cls)
        cls.TYPE = type_id
        cls.VERSION = version
        cls.NAME = cls.__name__
        kinds = cls._kinds()
        names = [f.name for f in fields(cls)]
        if list(kinds) != names:
            raise RuntimeError(f"{cls.__name__}: kinds {list(kinds)} do not match fields {names}")
        cls.FIELDS = tuple(kinds.items())
        # Records are built by the million: a faster __init__, and to_dict as one dict display.
        setattr(cls, "__init__", slot_init(cls))  # noqa: B010  # mypy refuses assigning methods of type[R]
        if not any(hasattr(kind, "keys") for _, kind in cls.FIELDS):
            setattr(cls, "to_dict", _plain_to_dict(cls))  # noqa: B010  # mypy refuses assigning methods of type[R]
        RECORD_TYPES[type_id] = cls
        _FAST_DECODERS[type_id] = _fast_decoder(cls)
        return cls

    return wrap


def _plain_to_dict(cls: type[Record]) -> Callable[[Record], dict[str, Any]]:
    """``Record.to_dict`` for a class without map fields, as one dict display (~3x faster than
    the generic loop; the records of every batch are turned into dicts to be encoded)."""
    items = "".join(f", {name!r}: self.{name}" for name, _ in cls.FIELDS)
    env: dict[str, Any] = {}
    exec(
        f"def to_dict(self):\n    return {{'type': {cls.TYPE}, 'version': {cls.VERSION}{items}}}",
        env,
    )
    to_dict: Callable[[Record], dict[str, Any]] = env["to_dict"]
    to_dict.__qualname__ = f"{cls.__name__}.to_dict"
    to_dict.__doc__ = Record.to_dict.__doc__
    return to_dict


def record_from_dict(d: Any) -> Record:
    """Strictly decode one record map into its dataclass."""
    if type(d) is dict:
        type_id = d.get("type")
        fast = _FAST_DECODERS.get(type_id) if type(type_id) is int else None  # True == 1
        if fast is not None:
            record = fast(d)
            if record is not None:
                return record
    return _record_from_dict_checked(d)


def _record_from_dict_checked(d: Any) -> Record:
    """The generic strict decoder: accepts what the fast decoders accept plus what they leave
    to it (lists where tuples are expected, a version equal to but not an int), and names what
    is wrong in everything it refuses."""
    if not isinstance(d, dict):
        raise RecordDecodeError(f"a record must be a map, got {type(d).__name__}")
    type_id = d.get("type")
    cls = RECORD_TYPES.get(type_id) if type(type_id) is int else None
    if cls is None:
        raise RecordDecodeError(f"unknown record type {type_id!r}")
    version = d.get("version")
    if version != cls.VERSION:
        raise RecordDecodeError(
            f"{cls.NAME}: unsupported version {version!r} (supported: {cls.VERSION})"
        )
    if len(d) != len(cls.FIELDS) + 2:
        expected = {"type", "version", *(n for n, _ in cls.FIELDS)}
        missing, extra = expected - set(d), set(d) - expected
        raise RecordDecodeError(
            f"{cls.NAME}: "
            + "; ".join(
                s
                for s in (
                    f"missing field(s) {sorted(missing)}" if missing else "",
                    f"unknown field(s) {sorted(map(str, extra))}" if extra else "",
                )
                if s
            )
        )
    try:  # fast path; the loop below only runs to name what is wrong
        return cls(*[kind(d[name]) for name, kind in cls.FIELDS])
    except (KeyError, TypeError):
        pass
    values = []
    for name, kind in cls.FIELDS:
        if name not in d:
            raise RecordDecodeError(f"{cls.NAME}: missing field {name!r}")
        try:
            values.append(kind(d[name]))
        except TypeError as e:
            raise RecordDecodeError(f"{cls.NAME}.{name}: {e}, got {d[name]!r}") from None
    return cls(*values)


# Fast strict decoders, one per record type, generated from the field kinds: exact type checks
# inline (lists of integers must already be tuples, as ``unpackb(use_list=False)`` makes them),
# the record built through its slot setters. They return None for anything they do not accept
# outright (wrong type, missing key, a list where a tuple is expected), and the generic decoder
# above then decides: it accepts the same values (normalised) or names what is wrong.
_FAST_CHECKS: dict[Any, str] = {
    INT: "type({v}) is int",
    STR: "type({v}) is str",
    BOOL: "type({v}) is bool",
    OPT_STR: "({v} is None or type({v}) is str)",
    OPT_INT: "({v} is None or type({v}) is int)",
    INTS: "type({v}) is tuple",
    OPT_INTS: "({v} is None or type({v}) is tuple)",
}
FastDecoder = Callable[[Map], Record | None]
_FAST_DECODERS: dict[int, FastDecoder] = {}


def _fast_decoder(cls: type[Record]) -> FastDecoder:
    names = [name for name, _ in cls.FIELDS]
    env: dict[str, Any] = {
        "_cls": cls,
        "_new": object.__new__,
        "_only_ints": frozenset({int}).issuperset,
    }
    lines = [
        "def decode(d):",
        f"    if len(d) != {len(names) + 2}:",
        "        return None",
        "    try:",
        "        version = d['version']",
    ]
    lines += [f"        v{i} = d[{name!r}]" for i, name in enumerate(names)]
    lines += [
        "    except KeyError:",
        "        return None",
        f"    if type(version) is not int or version != {cls.VERSION}:",
        "        return None",
    ]
    checks, int_lists = [], []
    for i, (name, kind) in enumerate(cls.FIELDS):
        if kind in _FAST_CHECKS:
            checks.append(_FAST_CHECKS[kind].format(v=f"v{i}"))
            if kind in (INTS, OPT_INTS):  # their items: one pass over all of them below
                int_lists.append(f"v{i}" if kind is INTS else f"(v{i} or ())")
        else:  # kinds that normalise (lists of maps): run the validator itself
            env[f"_k{i}"] = kind
            lines += [
                "    try:",
                f"        v{i} = _k{i}(v{i})",
                "    except TypeError:",
                "        return None",
            ]
    if int_lists:
        checks.append(f"_only_ints(map(type, {' + '.join(int_lists)}))")  # (tuples: checked first)
    if checks:
        lines += [f"    if not ({' and '.join(checks)}):", "        return None"]
    lines.append("    r = _new(_cls)")
    for i, name in enumerate(names):
        env[f"_s{i}"] = cls.__dict__[name].__set__
        lines.append(f"    _s{i}(r, v{i})")
    lines.append("    return r")
    exec("\n".join(lines), env)
    decode: FastDecoder = env["decode"]
    return decode


def decode_record(data: bytes) -> Record:
    """Decode one msgpack-encoded record."""
    try:
        d = msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=False)
    except Exception as e:  # msgpack raises several unrelated types
        raise RecordDecodeError(f"not a msgpack record: {e}") from None
    return record_from_dict(d)


# ---------------------------------------------------------------------------------------------
# The records. Names and meanings follow Kafka's metadata schemas; see docs/kraft-notes.md, Records.
# ---------------------------------------------------------------------------------------------

FENCE_UNCHANGED, FENCE, UNFENCE = 0, 1, -1
LEADER_NONE, LEADER_UNCHANGED = -1, -2
RECOVERED, RECOVERING, RECOVERY_UNCHANGED = 0, 1, -1
RESOURCE_TOPIC, RESOURCE_BROKER = 2, 4


@record_type(0)
class RegisterBrokerRecord(Record):
    broker_id: int
    incarnation_id: str
    broker_epoch: int
    endpoints: tuple[Map, ...]
    features: tuple[Map, ...]
    rack: str | None
    fenced: bool
    in_controlled_shutdown: bool

    @staticmethod
    def _kinds() -> dict[str, Kind]:
        return dict(
            broker_id=INT,
            incarnation_id=STR,
            broker_epoch=INT,
            endpoints=ENDPOINTS,
            features=FEATURES,
            rack=OPT_STR,
            fenced=BOOL,
            in_controlled_shutdown=BOOL,
        )


@record_type(1)
class UnregisterBrokerRecord(Record):
    broker_id: int
    broker_epoch: int

    @staticmethod
    def _kinds() -> dict[str, Kind]:
        return dict(broker_id=INT, broker_epoch=INT)


@record_type(2)
class TopicRecord(Record):
    name: str
    topic_id: str

    @staticmethod
    def _kinds() -> dict[str, Kind]:
        return dict(name=STR, topic_id=STR)


@record_type(3)
class PartitionRecord(Record):
    partition_id: int
    topic_id: str
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    removing_replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...]
    leader: int
    leader_recovery_state: int
    leader_epoch: int
    partition_epoch: int

    @staticmethod
    def _kinds() -> dict[str, Kind]:
        return dict(
            partition_id=INT,
            topic_id=STR,
            replicas=INTS,
            isr=INTS,
            removing_replicas=INTS,
            adding_replicas=INTS,
            leader=INT,
            leader_recovery_state=INT,
            leader_epoch=INT,
            partition_epoch=INT,
        )


@record_type(4)
class ConfigRecord(Record):
    resource_type: int
    resource_name: str
    name: str
    value: str | None

    @staticmethod
    def _kinds() -> dict[str, Kind]:
        return dict(resource_type=INT, resource_name=STR, name=STR, value=OPT_STR)


@record_type(5)
class PartitionChangeRecord(Record):
    """A change to one partition. ``None`` / ``LEADER_UNCHANGED`` / ``RECOVERY_UNCHANGED`` mean
    "unchanged". ``election`` (pykraft's addition) says how a new leader was chosen:
    ``clean``, ``preferred``, ``unclean`` or None when ``leader`` is unchanged."""

    partition_id: int
    topic_id: str
    isr: tuple[int, ...] | None
    leader: int
    replicas: tuple[int, ...] | None
    removing_replicas: tuple[int, ...] | None
    adding_replicas: tuple[int, ...] | None
    leader_recovery_state: int
    election: str | None

    @staticmethod
    def _kinds() -> dict[str, Kind]:
        return dict(
            partition_id=INT,
            topic_id=STR,
            isr=OPT_INTS,
            leader=INT,
            replicas=OPT_INTS,
            removing_replicas=OPT_INTS,
            adding_replicas=OPT_INTS,
            leader_recovery_state=INT,
            election=OPT_STR,
        )


@record_type(9)
class RemoveTopicRecord(Record):
    topic_id: str

    @staticmethod
    def _kinds() -> dict[str, Kind]:
        return dict(topic_id=STR)


@record_type(12)
class FeatureLevelRecord(Record):
    name: str
    feature_level: int

    @staticmethod
    def _kinds() -> dict[str, Kind]:
        return dict(name=STR, feature_level=INT)


@record_type(15)
class ProducerIdsRecord(Record):
    broker_id: int
    broker_epoch: int
    next_producer_id: int

    @staticmethod
    def _kinds() -> dict[str, Kind]:
        return dict(broker_id=INT, broker_epoch=INT, next_producer_id=INT)


@record_type(17)
class BrokerRegistrationChangeRecord(Record):
    """``fenced``: FENCE (1), UNFENCE (-1) or FENCE_UNCHANGED (0); ``in_controlled_shutdown``: 1 =
    entering controlled shutdown, 0 = unchanged."""

    broker_id: int
    broker_epoch: int
    fenced: int
    in_controlled_shutdown: int

    @staticmethod
    def _kinds() -> dict[str, Kind]:
        return dict(broker_id=INT, broker_epoch=INT, fenced=INT, in_controlled_shutdown=INT)


@record_type(20)
class NoOpRecord(Record):
    @staticmethod
    def _kinds() -> dict[str, Kind]:
        return {}


@record_type(100)
class LeaderChangeRecord(Record):
    """pykraft's addition (Kafka writes a Raft control record): a controller became active in
    ``term``. Written first by every newly active controller, so failovers are in the history."""

    leader_id: int
    term: int

    @staticmethod
    def _kinds() -> dict[str, Kind]:
        return dict(leader_id=INT, term=INT)


RECORD_NAMES: dict[str, type[Record]] = {cls.NAME: cls for cls in RECORD_TYPES.values()}

# ---------------------------------------------------------------------------------------------
# Batches
# ---------------------------------------------------------------------------------------------

# Format 2 (written since controller v2): the active controller builds a batch before Raft has
# placed it, so the batch no longer carries the Raft entry's index and position (format 1 did; a
# format-1 batch still decodes, with its stored values, and re-encodes to the same bytes).
BATCH_FORMAT = 2
READABLE_BATCH_FORMATS = (1, 2)
ZERO_HASH = bytes(32)
_PROVENANCE_KEYS = ("principal", "client_id", "request_id", "api", "reason")
_FIVE_INTS = (int,) * 5
_FIVE_STRS = (str,) * 5
_BATCH_KEYS_V1 = (
    "format",
    "base_offset",
    "term",
    "raft_index",
    "raft_position",
    "timestamp_ms",
    "provenance",
    "prev_hash",
    "records",
)
_BATCH_KEYS = (
    "format",
    "base_offset",
    "term",
    "timestamp_ms",
    "provenance",
    "prev_hash",
    "records",
)
BATCH_KEYS_BY_FORMAT = {1: _BATCH_KEYS_V1, 2: _BATCH_KEYS}


@dataclass(frozen=True, slots=True)
class Provenance:
    """Who asked for a change and why. ``reason`` is free text with stable words such as
    ``user-request``, ``session-timeout``, ``controlled-shutdown``, ``preferred-election``,
    ``unclean-election``, ``isr-shrink``, ``isr-expand``, ``broker-unfenced``, ``bootstrap``,
    ``controller-activated``."""

    principal: str = "ANONYMOUS"
    client_id: str = ""
    request_id: str = ""
    api: str = ""
    reason: str = ""

    def to_dict(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in _PROVENANCE_KEYS}


Provenance.__init__ = slot_init(Provenance)  # type: ignore[method-assign]  # faster __init__


@dataclass(frozen=True, slots=True)
class Batch:
    """An atomic group of records appended to the metadata log at ``base_offset``."""

    base_offset: int
    term: int
    raft_index: int
    timestamp_ms: int
    provenance: Provenance
    prev_hash: bytes
    records: tuple[Record, ...] = field(default=())
    raft_position: int = 0  # index of the command within its (group-committed) Raft entry
    # 2 (current) has no raft_index/raft_position in its bytes (they read as 0); 1 has them
    fmt: int = BATCH_FORMAT
    # batch_hash of the bytes decode_batch read this batch from (None when built in memory), so a
    # replay adopts its hash without re-encoding it. Not compared; dataclasses.replace drops it.
    digest: bytes | None = field(default=None, init=False, compare=False, repr=False)

    @property
    def last_offset(self) -> int:
        return self.base_offset + len(self.records) - 1

    @property
    def next_offset(self) -> int:
        return self.base_offset + len(self.records)

    def to_dict(self) -> dict[str, Any]:
        p = self.provenance
        provenance = {
            "principal": p.principal,
            "client_id": p.client_id,
            "request_id": p.request_id,
            "api": p.api,
            "reason": p.reason,
        }
        records = [r.to_dict() for r in self.records]
        if self.fmt == 1:
            return {
                "format": 1,
                "base_offset": self.base_offset,
                "term": self.term,
                "raft_index": self.raft_index,
                "raft_position": self.raft_position,
                "timestamp_ms": self.timestamp_ms,
                "provenance": provenance,
                "prev_hash": self.prev_hash,
                "records": records,
            }
        return {
            "format": self.fmt,
            "base_offset": self.base_offset,
            "term": self.term,
            "timestamp_ms": self.timestamp_ms,
            "provenance": provenance,
            "prev_hash": self.prev_hash,
            "records": records,
        }

    def encode(self) -> bytes:
        """The batch's canonical bytes (what is framed on disk and hashed)."""
        return _packb(self.to_dict())


Batch.__init__ = slot_init(Batch)  # type: ignore[method-assign]  # faster __init__


def batch_hash(encoded: bytes | memoryview) -> bytes:
    """The hash that the next batch carries as ``prev_hash``: SHA-256 of the encoded batch."""
    return hashlib.sha256(encoded).digest()


def decode_batch(encoded: bytes | memoryview, check_records: bool = True) -> Batch:
    """Strictly decode a batch from its canonical bytes. ``check_records=False`` (start-up
    recovery, which needs only the batch fields and the record count) leaves the records as
    undecoded maps: half the cost; whoever reads the batch later decodes it strictly."""
    try:  # arrays as tuples: what record fields hold, so the fast decoders take them as they are
        d = msgpack.unpackb(encoded, raw=False, strict_map_key=False, use_list=False)
    except Exception as e:
        raise RecordDecodeError(f"not a msgpack batch: {e}") from None
    batch = batch_from_dict(d, check_records)
    object.__setattr__(batch, "digest", batch_hash(encoded))
    return batch


def decode_batch_envelope(encoded: bytes | memoryview) -> Batch:
    """Decode a batch's own fields only, for start-up recovery (chain, offsets, terms): the
    records are walked by msgpack without being built (``records`` holds one ``None`` per
    record), about 13x cheaper than ``decode_batch(check_records=False)`` for a 100-record
    batch. The same envelope checks as :func:`decode_batch`; whoever reads the batch later
    decodes it strictly."""
    unpacker = msgpack.Unpacker(
        raw=False, strict_map_key=False, use_list=False, max_buffer_size=max(len(encoded), 1)
    )
    unpacker.feed(encoded)
    d: dict[str, Any] = {}
    try:
        size = unpacker.read_map_header()
        keys = _BATCH_KEYS if size == len(_BATCH_KEYS) else _BATCH_KEYS_V1
        if size != len(keys):
            raise RecordDecodeError(f"a batch must be a map with keys {list(_BATCH_KEYS)}")
        for expected in keys:
            key = unpacker.unpack()
            if key != expected:
                raise RecordDecodeError(
                    f"a batch must be a map with keys {list(keys)}, "
                    f"found {key!r} where {expected!r} belongs"
                )
            if key == "records":
                count = unpacker.read_array_header()
                for _ in range(count):
                    unpacker.skip()
                d[key] = (None,) * count
            else:
                d[key] = unpacker.unpack()
        try:
            unpacker.unpack()
        except msgpack.OutOfData:
            pass
        else:
            raise RecordDecodeError("extra data after the batch")
    except RecordDecodeError:
        raise
    except Exception as e:  # msgpack raises several unrelated types on garbage
        raise RecordDecodeError(f"not a msgpack batch: {e}") from None
    batch = batch_from_dict(d, check_records=False)
    object.__setattr__(batch, "digest", batch_hash(encoded))
    return batch


def batch_from_dict(d: Any, check_records: bool = True) -> Batch:
    """A batch from its decoded map: format 2 (current) or format 1 (raft fields stored)."""
    if isinstance(d, dict) and tuple(d) == _BATCH_KEYS:
        fmt, base_offset, term, timestamp_ms, p, prev_hash, records = d.values()
        raft_index = raft_position = 0
    elif isinstance(d, dict) and tuple(d) == _BATCH_KEYS_V1:
        fmt, base_offset, term, raft_index, raft_position, timestamp_ms, p, prev_hash, records = (
            d.values()
        )
    else:
        keys = sorted(map(str, d)) if isinstance(d, dict) else type(d).__name__
        raise RecordDecodeError(f"a batch must be a map with keys {list(_BATCH_KEYS)}, got {keys}")
    if type(fmt) is not int or fmt != (1 if len(d) == len(_BATCH_KEYS_V1) else BATCH_FORMAT):
        raise RecordDecodeError(f"unsupported batch format {fmt!r}")
    if (
        type(base_offset),
        type(term),
        type(raft_index),
        type(raft_position),
        type(timestamp_ms),
    ) != _FIVE_INTS:
        for key in ("base_offset", "term", "raft_index", "raft_position", "timestamp_ms"):
            if type(d.get(key, 0)) is not int:
                raise RecordDecodeError(f"batch {key} must be an integer, got {d[key]!r}")
    if type(p) is dict and tuple(p) == _PROVENANCE_KEYS:  # the canonical order: one check
        if tuple(map(type, p.values())) != _FIVE_STRS:
            raise RecordDecodeError(f"bad batch provenance {p!r}")
        provenance = Provenance(*p.values())
    elif (
        isinstance(p, dict)
        and set(p) == set(_PROVENANCE_KEYS)
        and all(type(v) is str for v in p.values())
    ):
        provenance = Provenance(**{k: p[k] for k in _PROVENANCE_KEYS})
    else:
        raise RecordDecodeError(f"bad batch provenance {p!r}")
    if type(prev_hash) is not bytes or len(prev_hash) != 32:
        raise RecordDecodeError("batch prev_hash must be 32 bytes")
    if type(records) not in (list, tuple):
        raise RecordDecodeError("batch records must be a list")
    records = tuple(map(record_from_dict, records)) if check_records else tuple(records)
    return Batch(
        base_offset,
        term,
        raft_index,
        timestamp_ms,
        provenance,
        prev_hash,
        records,
        raft_position,
        fmt,
    )


def record_to_json(record: Record) -> dict[str, Any]:
    """A JSON-friendly view of a record: ``{"type": name, "version": v, ...fields}``."""
    out: dict[str, Any] = {"type": record.NAME, "version": record.VERSION}
    for name, _ in record.FIELDS:
        v = getattr(record, name)
        out[name] = list(v) if isinstance(v, tuple) else v
    return out
