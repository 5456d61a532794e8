"""The metadata image: immutable cluster state at one log offset.

Every controller and every broker derives the same :class:`MetadataImage` by replaying the same
metadata log (``kraft.metadata.replay``) through a ``kraft.metadata.delta.MetadataDelta``.
Unchanged :class:`TopicImage` and ``BrokerRegistration`` objects are shared between images, and a
topic's partitions live in a ``PartitionMap``.

Every mapping held by an image is read-only by convention (plain dicts for speed): never mutate
one. Replay rules follow Kafka's (docs/kraft-notes.md: Records, Epochs and ids, Broker metadata path).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kraft.metadata.checksum import CHECKSUM_VERSION, image_checksum, topic_digest
from kraft.metadata.partition_map import sorted_partition_items
from kraft.metadata.registrations import BrokerRegistration, PartitionRegistration
from kraft.records import (
    LEADER_NONE,
    ZERO_HASH,
    ConfigRecord,
    FeatureLevelRecord,
    LeaderChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    Record,
    TopicRecord,
)
from kraft.slots import slot_init

__all__ = ["EMPTY_MAP", "MetadataImage", "TopicImage"]


@dataclass(frozen=True, slots=True)
class TopicImage:
    """A topic: its name, id and partitions (id -> registration)."""

    name: str
    topic_id: str
    partitions: Mapping[int, PartitionRegistration]
    # Cache of digest() (the topic is immutable; images share unchanged topics, so an image's
    # checksum re-hashes only the topics that changed since an earlier image's checksum).
    _digest: bytes | None = field(default=None, init=False, compare=False, repr=False)
    _leaderless: tuple[int, ...] | None = field(default=None, init=False, compare=False, repr=False)

    def digest(self) -> bytes:
        """The topic's checksum-version-2 digest (``kraft.metadata.checksum.topic_digest``)."""
        d = self._digest
        if d is None:
            d = topic_digest(self.name, self.topic_id, self.partitions)
            object.__setattr__(self, "_digest", d)
        return d

    def leaderless(self) -> tuple[int, ...]:
        """Ids of the partitions without a leader, ascending (cached like :meth:`digest`: an
        unfence looks for them in every topic, and unchanged topics answer from the cache)."""
        found = self._leaderless
        if found is None:
            found = tuple(sorted(pid for pid, p in self.partitions.items() if p[4] == LEADER_NONE))
            object.__setattr__(self, "_leaderless", found)
        return found


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
        return self.configs.get((resource_type, resource_name), EMPTY_MAP)

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

    def iter_records(
        self, with_partitions: bool = True, with_topics: bool = True
    ) -> Iterator[Record]:
        """The image as records in canonical order: FeatureLevel (by name), RegisterBroker (by id),
        per topic by name: Topic then Partition (by id), Config (by type, name, key), ProducerIds
        (if any were allocated), LeaderChange (if a controller was ever active).
        ``with_partitions=False`` leaves out the PartitionRecords, ``with_topics=False`` the
        TopicRecords too (the checksum digests topics apart)."""
        for name in sorted(self.features):
            yield FeatureLevelRecord(name, self.features[name])
        for broker_id in sorted(self.brokers):
            yield self.brokers[broker_id].to_record()
        for name in self.topic_names() if with_topics else ():
            topic_id = self.topics_by_name[name]
            yield TopicRecord(name, topic_id)
            if with_partitions:
                for pid, reg in sorted_partition_items(self.topics_by_id[topic_id].partitions):
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
                items = sorted_partition_items(self.topics_by_id[topic_id].partitions)
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
        """Hex SHA-256 of the image's canonical records and offset; every node computes the same
        (definitions: ``kraft.metadata.checksum``). The version-2 result is cached on the image."""
        if version != 2:
            return image_checksum(self, version)
        cached = self._checksum
        if cached is None:
            cached = image_checksum(self, 2)
            object.__setattr__(self, "_checksum", cached)
        return cached


EMPTY_MAP: Mapping[Any, Any] = {}
"""The shared empty mapping (read-only)."""

# built once per applied command / changed topic: slot-setting __init__s
for _cls in (TopicImage, MetadataImage):
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
