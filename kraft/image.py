"""The metadata image (immutable cluster state at one log offset) and the delta that builds the next.

Every controller and every broker derives the same :class:`MetadataImage` by replaying the same
metadata log. Replay goes through a :class:`MetadataDelta`: records are replayed into the delta
(which validates each against the image plus the changes so far and raises :class:`ReplayError`
on a record that does not fit), and :meth:`MetadataDelta.apply` builds the next image.

``apply()`` costs O(changed), not O(image): unchanged :class:`TopicImage` and
:class:`BrokerRegistration` objects are shared between images, and a topic's partitions live in a
:class:`PartitionMap` split into chunks of 1024 partition ids, so changing one partition of a
1,000,000-partition topic copies one chunk plus the chunk index.

Every mapping held by an image is read-only by convention (plain dicts for speed): never mutate
one. Replay rules follow Kafka's (docs/kraft-notes.md: Records, Epochs and ids, Broker metadata path).
"""

from __future__ import annotations

import gc
import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import groupby
from operator import attrgetter, itemgetter
from typing import Any, ClassVar, NamedTuple

import msgpack

from kraft.records import (
    FENCE,
    FENCE_UNCHANGED,
    LEADER_NONE,
    LEADER_UNCHANGED,
    RECOVERY_UNCHANGED,
    RESOURCE_TOPIC,
    UNFENCE,
    ZERO_HASH,
    Batch,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    FeatureLevelRecord,
    LeaderChangeRecord,
    NoOpRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    Record,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnregisterBrokerRecord,
    batch_hash,
)
from kraft.slots import slot_init

__all__ = [
    "CHECKSUM_VERSION",
    "BrokerRegistration",
    "LocalChanges",
    "MetadataDelta",
    "MetadataImage",
    "PartitionMap",
    "PartitionRegistration",
    "ReplayError",
    "TopicImage",
    "image_from_records",
]


CHECKSUM_VERSION = 2
"""The definition :meth:`MetadataImage.checksum` computes by default (1 = the legacy one)."""


class ReplayError(Exception):
    """A record that does not fit the image it is replayed into (a fatal fault, not a user error)."""


# ---------------------------------------------------------------------------------------------
# Registrations
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """A registered broker. ``epoch`` is the offset of its latest RegisterBrokerRecord."""

    broker_id: int
    incarnation_id: str
    epoch: int
    endpoints: tuple[dict[str, Any], ...]
    features: tuple[dict[str, Any], ...]
    rack: str | None
    fenced: bool
    in_controlled_shutdown: bool

    @property
    def is_active(self) -> bool:
        """Unfenced and not in controlled shutdown: may lead, join ISRs and get new replicas."""
        return not self.fenced and not self.in_controlled_shutdown

    @classmethod
    def from_record(cls, r: RegisterBrokerRecord) -> BrokerRegistration:
        return cls(
            r.broker_id,
            r.incarnation_id,
            r.broker_epoch,
            r.endpoints,
            r.features,
            r.rack,
            r.fenced,
            r.in_controlled_shutdown,
        )

    def to_record(self) -> RegisterBrokerRecord:
        return RegisterBrokerRecord(
            self.broker_id,
            self.incarnation_id,
            self.epoch,
            self.endpoints,
            self.features,
            self.rack,
            self.fenced,
            self.in_controlled_shutdown,
        )


class PartitionRegistration(NamedTuple):
    """One partition's replicas (preferred order first), ISR, leader and epochs.

    A named tuple of exactly these fields in this order (immutable), so that a snapshot row's
    values ``row[2:]`` become a registration in one C call and a topic's checksum digest packs
    registrations as they are."""

    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    removing_replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...]
    leader: int
    leader_recovery_state: int
    leader_epoch: int
    partition_epoch: int

    @classmethod
    def from_record(cls, r: PartitionRecord) -> PartitionRegistration:
        return _new_registration(_partition_record_values(r))

    def to_record(self, topic_id: str, partition_id: int) -> PartitionRecord:
        return PartitionRecord(partition_id, topic_id, *self)

    @property
    def preferred_leader(self) -> int:
        """replicas[0], or LEADER_NONE for a partition without replicas."""
        return self.replicas[0] if self.replicas else LEADER_NONE

    def merge(self, change: PartitionChangeRecord) -> PartitionRegistration:
        """The registration after ``change``: unchanged fields stay, partition epoch + 1 always,
        leader epoch + 1 iff the change sets the leader (even to the same broker)."""
        replicas, isr, removing, adding, leader, recovery, leader_epoch, partition_epoch = self
        if change.leader != LEADER_UNCHANGED:
            leader, leader_epoch = change.leader, leader_epoch + 1
        if change.leader_recovery_state != RECOVERY_UNCHANGED:
            recovery = change.leader_recovery_state
        return _new_registration(
            (
                replicas if change.replicas is None else change.replicas,
                isr if change.isr is None else change.isr,
                removing if change.removing_replicas is None else change.removing_replicas,
                adding if change.adding_replicas is None else change.adding_replicas,
                leader,
                recovery,
                leader_epoch,
                partition_epoch + 1,
            )
        )


# PartitionRegistration from a tuple of its 8 values, without the keyword-handling __new__.
_new_registration: Callable[[tuple[Any, ...]], PartitionRegistration] = partial(
    tuple.__new__, PartitionRegistration
)
# A PartitionRecord's values after partition_id and topic_id: its registration's fields.
_partition_record_values = attrgetter(*PartitionRegistration._fields)


# ---------------------------------------------------------------------------------------------
# Partition map: a persistent mapping partition id -> registration
# ---------------------------------------------------------------------------------------------

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

    def sorted_items(self) -> list[tuple[int, PartitionRegistration]]:
        """``(partition id, registration)`` pairs by id."""
        out: list[tuple[int, PartitionRegistration]] = []
        for ci in sorted(self._chunks):
            chunk = self._chunks[ci]
            out += sorted(chunk.items(), key=_first)
        return out

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


# ---------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopicImage:
    """A topic: its name, id and partitions (id -> registration)."""

    name: str
    topic_id: str
    partitions: Mapping[int, PartitionRegistration]
    # Cache of digest() (the topic is immutable; images share unchanged topics, so an image's
    # checksum re-hashes only the topics that changed since an earlier image's checksum).
    _digest: bytes | None = field(default=None, init=False, compare=False, repr=False)

    def digest(self) -> bytes:
        """SHA-256 of ``msgpack([name, topic_id, [partition ids...], [[replicas, isr,
        removing_replicas, adding_replicas, leader, leader_recovery_state, leader_epoch,
        partition_epoch] per partition...]])``, partitions by id (checksum version 2)."""
        d = self._digest
        if d is None:
            items = _sorted_items(self.partitions)
            pids = [pid for pid, _ in items]
            regs = [reg for _, reg in items]  # a registration packs as the list of its fields
            d = hashlib.sha256(
                msgpack.packb([self.name, self.topic_id, pids, regs], use_bin_type=True)
            ).digest()
            object.__setattr__(self, "_digest", d)
        return d


@dataclass(frozen=True, slots=True)
class LocalChanges:
    """What a delta means for one broker's replicas (docs/kraft-notes.md, Broker metadata path).

    ``deletes``: (topic name, topic id, partition) no longer hosted (topic deleted or the broker
    left the replica set). ``leaders`` / ``followers``: (topic name, partition) -> (topic id,
    new registration) for partitions this broker now leads / follows whose partition epoch changed
    (new partitions included)."""

    deletes: list[tuple[str, str, int]]
    leaders: dict[tuple[str, int], tuple[str, PartitionRegistration]]
    followers: dict[tuple[str, int], tuple[str, PartitionRegistration]]


@dataclass(frozen=True, slots=True)
class MetadataImage:
    """Cluster metadata as of log offset ``offset`` (-1 = nothing replayed). Read-only."""

    offset: int
    term: int
    raft_index: int
    timestamp_ms: int
    last_hash: bytes
    features: Mapping[str, int]
    brokers: Mapping[int, BrokerRegistration]
    topics_by_id: Mapping[str, TopicImage]
    topics_by_name: Mapping[str, str]
    configs: Mapping[tuple[int, str], Mapping[str, str]]
    next_producer_id: int
    controller_id: int
    _checksum: str | None = field(default=None, init=False, compare=False, repr=False)
    _topic_names: tuple[str, ...] | None = field(
        default=None, init=False, compare=False, repr=False
    )

    EMPTY: ClassVar[MetadataImage]

    # ---- queries ----------------------------------------------------------------------------

    @property
    def next_offset(self) -> int:
        return self.offset + 1

    def topic(self, name: str) -> TopicImage | None:
        """The topic called ``name``, or None."""
        topic_id = self.topics_by_name.get(name)
        return None if topic_id is None else self.topics_by_id[topic_id]

    def topic_by_id(self, topic_id: str) -> TopicImage | None:
        return self.topics_by_id.get(topic_id)

    def partition(self, topic_id: str, partition_id: int) -> PartitionRegistration | None:
        topic = self.topics_by_id.get(topic_id)
        return None if topic is None else topic.partitions.get(partition_id)

    def broker(self, broker_id: int) -> BrokerRegistration | None:
        return self.brokers.get(broker_id)

    def active_brokers(self) -> list[BrokerRegistration]:
        """Registered brokers that are unfenced and not in controlled shutdown, by id."""
        return [self.brokers[b] for b in sorted(self.brokers) if self.brokers[b].is_active]

    def is_active_broker(self, broker_id: int) -> bool:
        reg = self.brokers.get(broker_id)
        return reg is not None and not reg.fenced and not reg.in_controlled_shutdown

    def config(self, resource_type: int, resource_name: str) -> Mapping[str, str]:
        """The dynamic config keys set on a resource (empty mapping when none)."""
        return self.configs.get((resource_type, resource_name), _EMPTY_MAP)

    def topic_names(self) -> tuple[str, ...]:
        """Every topic name, sorted (cached, and shared by the next image while no topic is
        created or deleted: a broker transition's steps each walk the topics in name order)."""
        names = self._topic_names
        if names is None:
            names = tuple(sorted(self.topics_by_name))
            object.__setattr__(self, "_topic_names", names)
        return names

    def partition_count(self) -> int:
        return sum(len(t.partitions) for t in self.topics_by_id.values())

    # ---- snapshots and checksums ------------------------------------------------------------

    def iter_records(self, with_partitions: bool = True) -> Iterator[Record]:
        """The image as records in canonical order: FeatureLevel (by name), RegisterBroker (by id),
        per topic by name: Topic then Partition (by id), Config (by type, name, key), ProducerIds
        (if any were allocated), LeaderChange (if a controller was ever active).
        ``with_partitions=False`` leaves out the PartitionRecords."""
        for name in sorted(self.features):
            yield FeatureLevelRecord(name, self.features[name])
        for broker_id in sorted(self.brokers):
            yield self.brokers[broker_id].to_record()
        for name in self.topic_names():
            topic_id = self.topics_by_name[name]
            yield TopicRecord(name, topic_id)
            if with_partitions:
                for pid, reg in _sorted_items(self.topics_by_id[topic_id].partitions):
                    yield reg.to_record(topic_id, pid)
        for resource in sorted(self.configs):
            entries = self.configs[resource]
            for key in sorted(entries):
                yield ConfigRecord(resource[0], resource[1], key, entries[key])
        if self.next_producer_id > 0:
            yield ProducerIdsRecord(-1, -1, self.next_producer_id)
        if self.controller_id >= 0:
            yield LeaderChangeRecord(self.controller_id, self.term)

    def record_runs(self) -> Iterator[tuple[type[Record], list[tuple[Any, ...]]]]:
        """:meth:`iter_records` as runs of consecutive records of one type: ``(record class,
        rows)``, each row the values of ``cls.FIELDS`` in order; partition rows come straight from
        the registrations (for ``kraft.log.snapshot.write_snapshot_runs``)."""
        cls: type[Record] | None = None
        rows: list[tuple[Any, ...]] = []
        for record in self.iter_records(with_partitions=False):
            if type(record) is not cls:
                if rows:
                    yield cls, rows  # type: ignore[misc]  # cls is set whenever rows is non-empty
                cls, rows = type(record), []
            rows.append(tuple([getattr(record, name) for name, _ in record.FIELDS]))
            if cls is TopicRecord:
                topic_id = record.topic_id  # type: ignore[attr-defined]  # a TopicRecord here (checked on the line above)
                items = _sorted_items(self.topics_by_id[topic_id].partitions)
                if items:
                    yield cls, rows
                    cls, rows = PartitionRecord, [(pid, topic_id, *reg) for pid, reg in items]
        if rows:
            yield cls, rows  # type: ignore[misc]  # cls is set whenever rows is non-empty

    def record_count(self) -> int:
        """How many records :meth:`iter_records` yields."""
        return (
            len(self.features)
            + len(self.brokers)
            + len(self.topics_by_id)
            + self.partition_count()
            + sum(len(c) for c in self.configs.values())
            + (self.next_producer_id > 0)
            + (self.controller_id >= 0)
        )

    def to_records(self) -> list[Record]:
        return list(self.iter_records())

    def checksum(self, version: int = CHECKSUM_VERSION) -> str:
        """Hex SHA-256 of the image's canonical records and offset; every node computes the same.

        Version 2 (default; snapshot format 2): ``msgpack([2, offset, [head records], [topic
        digests], [tail records]])`` where head = FeatureLevel and RegisterBroker records, tail =
        Config, ProducerIds and LeaderChange records (each ``record.to_dict()``, canonical order,
        as :meth:`iter_records`), and one :meth:`TopicImage.digest` per topic by name. Topic
        digests are cached on the shared immutable topics and the result on the image, so the
        checksum of an image after a small change costs O(topics), not O(partitions).
        Version 1 (snapshot format 1): ``msgpack([offset, [record.to_dict() ...]])``."""
        if version == 1:
            return self._checksum_v1()
        if version != 2:
            raise ValueError(f"unknown image checksum version {version}")
        cached = self._checksum
        if cached is None:
            head: list[dict[str, Any]] = []
            tail: list[dict[str, Any]] = []
            for record in self.iter_records(with_partitions=False):
                if type(record) is TopicRecord:
                    continue
                (head if type(record) in _HEAD_TYPES else tail).append(record.to_dict())
            topics = self.topics_by_id
            digests = [topics[self.topics_by_name[name]].digest() for name in self.topic_names()]
            payload = msgpack.packb([2, self.offset, head, digests, tail], use_bin_type=True)
            cached = hashlib.sha256(payload).hexdigest()
            object.__setattr__(self, "_checksum", cached)
        return cached

    def _checksum_v1(self) -> str:
        """The version 1 checksum, hashed in chunks so memory stays bounded."""
        packer = msgpack.Packer(use_bin_type=True)
        pack = packer.pack
        h = hashlib.sha256()
        h.update(packer.pack_array_header(2))
        h.update(pack(self.offset))
        h.update(packer.pack_array_header(self.record_count()))
        pending: list[bytes] = []
        for item in self._iter_record_dicts():
            pending.append(pack(item))
            if len(pending) >= 4096:
                h.update(b"".join(pending))
                pending.clear()
        h.update(b"".join(pending))
        return h.hexdigest()

    def _iter_record_dicts(self) -> Iterator[dict[str, Any]]:
        """``r.to_dict() for r in iter_records()``, without building the partition records."""
        partition_type, partition_version = PartitionRecord.TYPE, PartitionRecord.VERSION
        for record in self.iter_records(with_partitions=False):
            if type(record) is not TopicRecord:
                yield record.to_dict()
                continue
            yield record.to_dict()
            topic_id = record.topic_id
            for pid, reg in _sorted_items(self.topics_by_id[topic_id].partitions):
                # Same keys, same order as PartitionRecord.to_dict() (a test holds them equal).
                yield {
                    "type": partition_type,
                    "version": partition_version,
                    "partition_id": pid,
                    "topic_id": topic_id,
                    "replicas": reg.replicas,
                    "isr": reg.isr,
                    "removing_replicas": reg.removing_replicas,
                    "adding_replicas": reg.adding_replicas,
                    "leader": reg.leader,
                    "leader_recovery_state": reg.leader_recovery_state,
                    "leader_epoch": reg.leader_epoch,
                    "partition_epoch": reg.partition_epoch,
                }


_EMPTY_MAP: Mapping[Any, Any] = {}
_first, _second = itemgetter(0), itemgetter(1)
_registration_values = itemgetter(slice(2, None))  # a PartitionRecord row's registration fields
_HEAD_TYPES = (FeatureLevelRecord, RegisterBrokerRecord)


def _sorted_items(
    partitions: Mapping[int, PartitionRegistration],
) -> list[tuple[int, PartitionRegistration]]:
    if isinstance(partitions, PartitionMap):
        return partitions.sorted_items()
    return sorted(partitions.items(), key=_first)


# built once per applied command / changed topic / registration: slot-setting __init__s
for _cls in (BrokerRegistration, TopicImage, MetadataImage):
    _cls.__init__ = slot_init(_cls)  # type: ignore[method-assign]  # a faster generated __init__, same signature

MetadataImage.EMPTY = MetadataImage(
    offset=-1,
    term=0,
    raft_index=0,
    timestamp_ms=0,
    last_hash=ZERO_HASH,
    features={},
    brokers={},
    topics_by_id={},
    topics_by_name={},
    configs={},
    next_producer_id=0,
    controller_id=-1,
)


# ---------------------------------------------------------------------------------------------
# Delta
# ---------------------------------------------------------------------------------------------


class _TopicChange:
    """Pending changes to one topic: ``base`` is the TopicImage its partitions start from (its
    TopicImage in the delta's base image, or, for a full delta, in the image it reproduces) or
    None; ``created``: the topic is new in this delta (base None, or a full delta's);
    ``partitions`` holds changed registrations only."""

    __slots__ = ("base", "created", "name", "partitions", "topic_id")

    def __init__(
        self, name: str, topic_id: str, base: TopicImage | None, created: bool = False
    ) -> None:
        self.name = name
        self.topic_id = topic_id
        self.base = base
        self.created = created or base is None
        self.partitions: dict[int, PartitionRegistration] = {}

    def items(self) -> Iterator[tuple[int, PartitionRegistration]]:
        """``(partition id, registration)`` of every partition the topic has (created topics)."""
        changed = self.partitions
        if self.base is not None:
            for pid, reg in self.base.partitions.items():
                if pid not in changed:
                    yield pid, reg
        yield from changed.items()

    def current(self, pid: int) -> PartitionRegistration | None:
        reg = self.partitions.get(pid)
        if reg is None and self.base is not None:
            reg = self.base.partitions.get(pid)
        return reg


class MetadataDelta:
    """Changes replayed on top of ``image``; :meth:`apply` builds the next image.

    A delta sees its own changes: a PartitionChangeRecord may follow the PartitionRecord it
    changes in the same delta. Replaying a record that does not fit raises :class:`ReplayError`
    and leaves the delta unusable."""

    def __init__(self, image: MetadataImage) -> None:
        self.image = image
        self._offset = image.offset
        self._term = image.term
        self._raft_index = image.raft_index
        self._timestamp_ms = image.timestamp_ms
        self._last_hash = image.last_hash
        self._feature_changes: dict[str, int] = {}
        self._broker_changes: dict[int, BrokerRegistration | None] = {}
        self._topic_changes: dict[str, _TopicChange] = {}
        self._created_names: dict[str, str] = {}  # name -> id of topics created in this delta
        self._deleted_topics: dict[str, TopicImage] = {}  # base topics removed in this delta
        self._config_changes: dict[tuple[int, str], dict[str, str]] = {}
        self._next_producer_id = image.next_producer_id
        self._controller_id = image.controller_id

    @classmethod
    def full(cls, image: MetadataImage) -> MetadataDelta:
        """A delta from the empty image that, applied, gives ``image`` (a full publish): the same
        changes as replaying ``image.iter_records()`` into ``MetadataDelta(MetadataImage.EMPTY)``
        and setting its provenance, built from the image's (immutable) registrations without
        records. More batches may be replayed into it. Costs O(topics): every topic starts from
        the image's own TopicImage, and :meth:`apply` shares the ones nothing changed since."""
        delta = cls(MetadataImage.EMPTY)
        delta._feature_changes = dict(image.features)
        delta._broker_changes = dict(image.brokers)
        for name in sorted(image.topics_by_name):
            topic = image.topics_by_id[image.topics_by_name[name]]
            delta._topic_changes[topic.topic_id] = _TopicChange(
                name, topic.topic_id, topic, created=True
            )
            delta._created_names[name] = topic.topic_id
        delta._config_changes = {key: dict(entries) for key, entries in image.configs.items()}
        delta._next_producer_id = image.next_producer_id
        delta._controller_id = image.controller_id
        delta.set_provenance(
            offset=image.offset,
            term=image.term,
            raft_index=image.raft_index,
            timestamp_ms=image.timestamp_ms,
            last_hash=image.last_hash,
        )
        return delta

    # ---- replay -----------------------------------------------------------------------------

    def replay(self, record: Record) -> None:
        """Replay one record; raises ReplayError if it does not fit."""
        handler = _DELTA_HANDLERS.get(type(record))
        if handler is None:
            raise ReplayError(f"no replay rule for record type {type(record).__name__}")
        handler(self, record)

    def replay_batch(self, batch: Batch, batch_hash_bytes: bytes | None = None) -> None:
        """Replay every record of ``batch``, then adopt its last offset, term, raft index, time
        and hash. ``batch_hash_bytes`` (= ``batch_hash(encoded)``) or, for a batch from
        ``decode_batch``, its ``digest`` saves re-encoding the batch.
        The batch must continue the delta: base offset = offset + 1 and prev_hash = last hash."""
        if batch.base_offset != self._offset + 1:
            raise ReplayError(
                f"batch at offset {batch.base_offset} does not follow offset {self._offset}"
            )
        if batch.prev_hash != self._last_hash:
            raise ReplayError(
                f"batch at offset {batch.base_offset}: prev_hash "
                f"{batch.prev_hash.hex()[:16]}… does not match the last hash "
                f"{self._last_hash.hex()[:16]}…"
            )
        if not batch.records:
            raise ReplayError(f"batch at offset {batch.base_offset} is empty")
        handlers = _DELTA_HANDLERS
        topic_changes = self._topic_changes
        offset = batch.base_offset
        try:
            for record in batch.records:  # the bulk of big batches (partitions) inlined
                if type(record) is PartitionChangeRecord:
                    change = topic_changes.get(record.topic_id)
                    if change is None:
                        change = self._open_topic(record.topic_id)
                    pid = record.partition_id
                    reg = change.partitions.get(pid)
                    if reg is None:
                        reg = change.current(pid)
                        if reg is None:
                            raise ReplayError(
                                f"PartitionChangeRecord: unknown partition {record.topic_id}:{pid}"
                            )
                    change.partitions[pid] = reg.merge(record)
                elif type(record) is PartitionRecord:
                    change = topic_changes.get(record.topic_id)
                    if change is None:
                        change = self._open_topic(record.topic_id)
                    change.partitions[record.partition_id] = _new_registration(
                        _partition_record_values(record)
                    )
                else:
                    handler = handlers.get(type(record))
                    if handler is None:
                        raise ReplayError(f"no replay rule for record type {type(record).__name__}")
                    handler(self, record)
                offset += 1
        except ReplayError as e:
            raise ReplayError(f"offset {offset}: {e}") from None
        self._offset = batch.last_offset
        self._term = batch.term
        self._raft_index = batch.raft_index
        self._timestamp_ms = batch.timestamp_ms
        if batch_hash_bytes is None:  # decoded batches know the hash of the bytes they came from
            batch_hash_bytes = (
                batch.digest if batch.digest is not None else batch_hash(batch.encode())
            )
        self._last_hash = batch_hash_bytes

    def set_provenance(
        self, *, offset: int, term: int, raft_index: int, timestamp_ms: int, last_hash: bytes
    ) -> None:
        """Set the position the next image reports (snapshot loading)."""
        self._offset, self._term, self._raft_index = offset, term, raft_index
        self._timestamp_ms, self._last_hash = timestamp_ms, last_hash

    # ---- current state (image + changes so far) ---------------------------------------------

    def current_broker(self, broker_id: int) -> BrokerRegistration | None:
        if broker_id in self._broker_changes:
            return self._broker_changes[broker_id]
        return self.image.brokers.get(broker_id)

    def current_topic_id(self, name: str) -> str | None:
        topic_id = self._created_names.get(name)
        if topic_id is not None:
            return topic_id
        topic_id = self.image.topics_by_name.get(name)
        if topic_id is None or topic_id in self._deleted_topics:
            return None
        return topic_id

    def _topic_exists(self, topic_id: str) -> bool:
        return topic_id in self._topic_changes or (
            topic_id in self.image.topics_by_id and topic_id not in self._deleted_topics
        )

    def _open_topic(self, topic_id: str) -> _TopicChange:
        change = self._topic_changes.get(topic_id)
        if change is not None:
            return change
        base = self.image.topics_by_id.get(topic_id)
        if base is None or topic_id in self._deleted_topics:
            raise ReplayError(f"unknown topic id {topic_id}")
        change = self._topic_changes[topic_id] = _TopicChange(base.name, topic_id, base)
        return change

    # ---- handlers ---------------------------------------------------------------------------

    def _replay_register_broker(self, r: RegisterBrokerRecord) -> None:
        self._broker_changes[r.broker_id] = BrokerRegistration.from_record(r)

    def _checked_broker(self, broker_id: int, epoch: int, what: str) -> BrokerRegistration:
        reg = self.current_broker(broker_id)
        if reg is None:
            raise ReplayError(f"{what}: broker {broker_id} is not registered")
        if reg.epoch != epoch:
            raise ReplayError(
                f"{what}: broker {broker_id} has epoch {reg.epoch}, record says {epoch}"
            )
        return reg

    def _replay_unregister_broker(self, r: UnregisterBrokerRecord) -> None:
        self._checked_broker(r.broker_id, r.broker_epoch, "UnregisterBrokerRecord")
        self._broker_changes[r.broker_id] = None

    def _replay_broker_change(self, r: BrokerRegistrationChangeRecord) -> None:
        reg = self._checked_broker(r.broker_id, r.broker_epoch, "BrokerRegistrationChangeRecord")
        if r.fenced == FENCE:
            fenced = True
        elif r.fenced == UNFENCE:
            fenced = False
        elif r.fenced == FENCE_UNCHANGED:
            fenced = reg.fenced
        else:
            raise ReplayError(f"BrokerRegistrationChangeRecord: bad fenced value {r.fenced}")
        if r.in_controlled_shutdown == 1:
            shutting_down = True
        elif r.in_controlled_shutdown == 0:
            shutting_down = reg.in_controlled_shutdown
        else:
            raise ReplayError(
                "BrokerRegistrationChangeRecord: bad in_controlled_shutdown value "
                f"{r.in_controlled_shutdown}"
            )
        self._broker_changes[r.broker_id] = replace(
            reg, fenced=fenced, in_controlled_shutdown=shutting_down
        )

    def _replay_topic(self, r: TopicRecord) -> None:
        if self._topic_exists(r.topic_id):
            raise ReplayError(f"TopicRecord: topic id {r.topic_id} already exists")
        if self.current_topic_id(r.name) is not None:
            raise ReplayError(f"TopicRecord: topic name {r.name!r} already exists")
        self._topic_changes[r.topic_id] = _TopicChange(r.name, r.topic_id, None)
        self._created_names[r.name] = r.topic_id

    def _replay_partition(self, r: PartitionRecord) -> None:
        change = self._topic_changes.get(r.topic_id)
        if change is None:
            change = self._open_topic(r.topic_id)
        change.partitions[r.partition_id] = _new_registration(_partition_record_values(r))

    def replay_partition_rows(self, rows: Iterable[tuple[Any, ...]]) -> None:
        """Replay PartitionRecords given as rows of field values in ``PartitionRecord.FIELDS``
        order (a snapshot chunk, values already type-checked): same rules as :meth:`replay`."""
        topic_changes = self._topic_changes
        for topic_id, group in groupby(rows, _second):  # rows come sorted by topic
            change = topic_changes.get(topic_id)
            if change is None:
                change = self._open_topic(topic_id)
            members = tuple(group)
            change.partitions.update(
                zip(
                    map(_first, members),
                    map(_new_registration, map(_registration_values, members)),
                )
            )

    def _replay_partition_change(self, r: PartitionChangeRecord) -> None:
        change = self._topic_changes.get(r.topic_id)
        if change is None:
            change = self._open_topic(r.topic_id)
        reg = change.current(r.partition_id)
        if reg is None:
            raise ReplayError(
                f"PartitionChangeRecord: unknown partition {r.topic_id}:{r.partition_id}"
            )
        change.partitions[r.partition_id] = reg.merge(r)

    def _replay_remove_topic(self, r: RemoveTopicRecord) -> None:
        topic_id = r.topic_id
        if not self._topic_exists(topic_id):
            raise ReplayError(f"RemoveTopicRecord: unknown topic id {topic_id}")
        change = self._topic_changes.pop(topic_id, None)
        if change is not None and change.created:  # created in this delta
            name = change.name
            del self._created_names[name]
        else:
            base = self.image.topics_by_id[topic_id]
            self._deleted_topics[topic_id] = base
            name = base.name
        key = (RESOURCE_TOPIC, name)
        if key in self._config_changes or key in self.image.configs:
            self._config_changes[key] = {}

    def _replay_config(self, r: ConfigRecord) -> None:
        key = (r.resource_type, r.resource_name)
        entries = self._config_changes.get(key)
        if entries is None:
            entries = self._config_changes[key] = dict(self.image.configs.get(key, _EMPTY_MAP))
        if r.value is None:
            entries.pop(r.name, None)
        else:
            entries[r.name] = r.value

    def _replay_feature_level(self, r: FeatureLevelRecord) -> None:
        if r.feature_level < 0:
            raise ReplayError(f"FeatureLevelRecord: negative level {r.feature_level} for {r.name}")
        self._feature_changes[r.name] = r.feature_level

    def _replay_producer_ids(self, r: ProducerIdsRecord) -> None:
        if r.next_producer_id <= self._next_producer_id:
            raise ReplayError(
                f"ProducerIdsRecord: next producer id {r.next_producer_id} does not "
                f"advance {self._next_producer_id}"
            )
        self._next_producer_id = r.next_producer_id

    def _replay_leader_change(self, r: LeaderChangeRecord) -> None:
        self._controller_id = r.leader_id

    # ---- introspection ----------------------------------------------------------------------

    @property
    def offset(self) -> int:
        """The last offset replayed into this delta (the base image's offset if none)."""
        return self._offset

    @property
    def created_topics(self) -> set[str]:
        """Ids of topics created in this delta (and not deleted again)."""
        return {tid for tid, c in self._topic_changes.items() if c.created}

    @property
    def deleted_topics(self) -> dict[str, TopicImage]:
        """Topic id -> the TopicImage (from the base image) of topics deleted in this delta."""
        return dict(self._deleted_topics)

    @property
    def changed_partitions(self) -> dict[str, set[int]]:
        """Topic id -> ids of partitions created or changed (topics that still exist)."""
        out = {}
        for tid, c in self._topic_changes.items():
            pids = set(pid for pid, _ in c.items()) if c.created else set(c.partitions)
            if pids:
                out[tid] = pids
        return out

    @property
    def changed_brokers(self) -> set[int]:
        """Ids of brokers registered, changed or unregistered in this delta."""
        return set(self._broker_changes)

    @property
    def changed_configs(self) -> set[tuple[int, str]]:
        return set(self._config_changes)

    @property
    def changed_features(self) -> set[str]:
        return set(self._feature_changes)

    def local_changes(self, broker_id: int) -> LocalChanges:
        """What this delta means for ``broker_id``'s replicas (docs/kraft-notes.md, Broker metadata path)."""
        deletes: list[tuple[str, str, int]] = []
        leaders: dict[tuple[str, int], tuple[str, PartitionRegistration]] = {}
        followers: dict[tuple[str, int], tuple[str, PartitionRegistration]] = {}
        for topic_id, old in self._deleted_topics.items():
            for pid, reg in old.partitions.items():
                if broker_id in reg.replicas:
                    deletes.append((old.name, topic_id, pid))
        for topic_id, change in self._topic_changes.items():
            if change.created:  # every partition is new
                name = change.name
                base = change.base
                items = (
                    base.partitions.items()
                    if base is not None and not change.partitions
                    else change.items()
                )
                for pid, reg in [
                    item for item in items if broker_id in item[1][0]
                ]:  # [0]: replicas
                    target = leaders if reg.leader == broker_id else followers
                    target[(name, pid)] = (topic_id, reg)
                continue
            base_partitions = change.base.partitions if change.base is not None else _EMPTY_MAP
            for pid, reg in change.partitions.items():
                prev = base_partitions.get(pid)
                if broker_id not in reg.replicas:
                    if prev is not None and broker_id in prev.replicas:
                        deletes.append((change.name, topic_id, pid))
                    continue
                if prev is not None and prev.partition_epoch == reg.partition_epoch:
                    continue
                target = leaders if reg.leader == broker_id else followers
                target[(change.name, pid)] = (topic_id, reg)
        deletes.sort()
        return LocalChanges(deletes, leaders, followers)

    # ---- apply ------------------------------------------------------------------------------

    def apply(self) -> MetadataImage:
        """The next image. Costs O(changed): untouched topics, brokers, configs are shared."""
        image = self.image

        features = image.features
        if self._feature_changes:
            features = dict(features)
            for name, level in self._feature_changes.items():
                if level == 0:
                    features.pop(name, None)
                else:
                    features[name] = level

        brokers = image.brokers
        if self._broker_changes:
            brokers = dict(brokers)
            for broker_id, reg in self._broker_changes.items():
                if reg is None:
                    brokers.pop(broker_id, None)
                else:
                    brokers[broker_id] = reg

        topics_by_id, topics_by_name = image.topics_by_id, image.topics_by_name
        if self._deleted_topics or self._topic_changes:
            by_id = dict(topics_by_id)
            # Names change only with deletions or creations: else every name keeps its id.
            renamed = bool(self._deleted_topics or self._created_names)
            by_name = dict(topics_by_name) if renamed else {}
            for topic_id, old in self._deleted_topics.items():
                del by_id[topic_id]
                if by_name.get(old.name) == topic_id:
                    del by_name[old.name]
            for topic_id, change in self._topic_changes.items():
                if change.created:  # then its name is in _created_names: by_name is the copy
                    by_name[change.name] = topic_id
                base = change.base
                if base is None:
                    topic = TopicImage(change.name, topic_id, PartitionMap.of(change.partitions))
                elif change.partitions:
                    topic = TopicImage(
                        change.name,
                        topic_id,
                        _as_partition_map(base.partitions).updated(change.partitions),
                    )
                elif change.created:  # a full delta's topic nothing changed: shared, digest too
                    topic = base
                else:
                    continue
                by_id[topic_id] = topic
            topics_by_id = by_id
            if renamed:
                topics_by_name = by_name

        configs = image.configs
        if self._config_changes:
            configs = dict(configs)
            for key, entries in self._config_changes.items():
                if entries:
                    configs[key] = dict(entries)
                else:
                    configs.pop(key, None)

        after = MetadataImage(  # positional (field order): an image per applied command
            self._offset,
            self._term,
            self._raft_index,
            self._timestamp_ms,
            self._last_hash,
            features,
            brokers,
            topics_by_id,
            topics_by_name,
            configs,
            self._next_producer_id,
            self._controller_id,
        )
        if topics_by_name is image.topics_by_name and image._topic_names is not None:
            object.__setattr__(after, "_topic_names", image._topic_names)
        return after


# Replay rule per record type (PartitionRecord is inlined in replay_batch as well).
_DELTA_HANDLERS: dict[type, Callable[..., None]] = {
    RegisterBrokerRecord: MetadataDelta._replay_register_broker,
    UnregisterBrokerRecord: MetadataDelta._replay_unregister_broker,
    BrokerRegistrationChangeRecord: MetadataDelta._replay_broker_change,
    TopicRecord: MetadataDelta._replay_topic,
    PartitionRecord: MetadataDelta._replay_partition,
    PartitionChangeRecord: MetadataDelta._replay_partition_change,
    RemoveTopicRecord: MetadataDelta._replay_remove_topic,
    ConfigRecord: MetadataDelta._replay_config,
    FeatureLevelRecord: MetadataDelta._replay_feature_level,
    ProducerIdsRecord: MetadataDelta._replay_producer_ids,
    LeaderChangeRecord: MetadataDelta._replay_leader_change,
    NoOpRecord: lambda delta, record: None,  # changes nothing
}


def _as_partition_map(partitions: Mapping[int, PartitionRegistration]) -> PartitionMap:
    return partitions if isinstance(partitions, PartitionMap) else PartitionMap.of(partitions)


@contextmanager
def _gc_paused(freeze: bool = False) -> Iterator[None]:
    """Pause the cyclic garbage collector: building an image allocates up to millions of acyclic
    objects, and every collection on the way would rescan all of them (~20% of a load).
    ``freeze``: on success, move every object alive to the collector's permanent generation
    (``gc.freeze``) before collection resumes, so the new image is never scanned at all."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        if freeze:
            gc.freeze()
    finally:
        if enabled:
            gc.enable()


def image_from_records(
    records: Iterable[Record],
    *,
    offset: int,
    term: int = 0,
    raft_index: int = 0,
    timestamp_ms: int = 0,
    last_hash: bytes = ZERO_HASH,
    freeze: bool = False,
) -> MetadataImage:
    """Build an image from a snapshot's records (as written by ``MetadataImage.iter_records``),
    positioned at ``offset`` (the last offset the snapshot includes).

    If ``records`` also offers ``iter_chunks()`` (as ``kraft.log.snapshot.read_snapshot``'s
    records do), it is read as ``(record class, rows of checked field values)`` chunks and
    PartitionRecord rows become registrations directly, without record objects.

    ``freeze=True`` (for a process that keeps the image, e.g. a broker): ``gc.freeze()`` once
    it is built. The image is acyclic and immutable, so the collector has nothing to find in
    it, yet would otherwise walk its millions of objects on the first collection after the load
    (~0.4 s per million partitions) and on every full collection after that (~0.3 s each, on
    the event loop). Objects that die later are still freed by reference counting."""
    delta = MetadataDelta(MetadataImage.EMPTY)
    replay = delta.replay
    iter_chunks = getattr(records, "iter_chunks", None)
    with _gc_paused(freeze):
        if iter_chunks is not None:
            for cls, rows in iter_chunks():
                if cls is PartitionRecord:
                    delta.replay_partition_rows(rows)
                else:
                    for row in rows:
                        replay(cls(*row))
        else:
            for record in records:
                replay(record)
        delta.set_provenance(
            offset=offset,
            term=term,
            raft_index=raft_index,
            timestamp_ms=timestamp_ms,
            last_hash=last_hash,
        )
        return delta.apply()
