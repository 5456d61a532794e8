"""The metadata delta: records replayed on top of an image, and the next image they make.

Records are replayed into a :class:`MetadataDelta`, which validates each against the image plus
the changes so far and raises :class:`ReplayError` on a record that does not fit;
:meth:`MetadataDelta.apply` builds the next image in O(changed), not O(image): unchanged topics
and registrations are shared, and a changed topic copies only the partition chunks it touches.
Replay rules follow Kafka's (docs/kraft-notes.md: Records, Epochs and ids, Broker metadata path).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from itertools import groupby
from operator import itemgetter
from typing import Any

from kraft.metadata.image import EMPTY_MAP, MetadataImage, TopicImage
from kraft.metadata.partition_map import PartitionMap, as_partition_map
from kraft.metadata.persistent_map import as_persistent_map
from kraft.metadata.registrations import (
    BrokerRegistration,
    PartitionRegistration,
    new_registration,
    partition_record_values,
    registration_values,
)
from kraft.records import (
    FENCE,
    FENCE_UNCHANGED,
    RESOURCE_TOPIC,
    UNFENCE,
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

__all__ = ["LocalChanges", "MetadataDelta", "ReplayError"]

_first, _second = itemgetter(0), itemgetter(1)


class ReplayError(Exception):
    """A record that does not fit the image it is replayed into (a fatal fault, not a user error)."""


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
                    change.partitions[record.partition_id] = new_registration(
                        partition_record_values(record)
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

    def current_topic_name(self, topic_id: str) -> str | None:
        """The name of topic ``topic_id`` as replayed so far, or None if it does not exist."""
        change = self._topic_changes.get(topic_id)
        if change is not None:
            return change.name
        if topic_id in self._deleted_topics:
            return None
        base = self.image.topics_by_id.get(topic_id)
        return None if base is None else base.name

    @property
    def next_producer_id(self) -> int:
        """The next unallocated producer id as replayed so far."""
        return self._next_producer_id

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
        change.partitions[r.partition_id] = new_registration(partition_record_values(r))

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
                    map(new_registration, map(registration_values, members)),
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
            entries = self._config_changes[key] = dict(self.image.configs.get(key, EMPTY_MAP))
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
            base_partitions = change.base.partitions if change.base is not None else EMPTY_MAP
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
            id_sets: dict[str, TopicImage] = {}
            name_sets: dict[str, str] = {}
            name_deletes = [
                old.name
                for topic_id, old in self._deleted_topics.items()
                if topics_by_name.get(old.name) == topic_id
            ]
            for topic_id, change in self._topic_changes.items():
                if change.created:
                    name_sets[change.name] = topic_id
                base = change.base
                if base is None:
                    topic = TopicImage(change.name, topic_id, PartitionMap.of(change.partitions))
                elif change.partitions:
                    topic = TopicImage(
                        change.name,
                        topic_id,
                        as_partition_map(base.partitions).updated(change.partitions),
                    )
                elif change.created:  # a full delta's topic nothing changed: shared, digest too
                    topic = base
                else:
                    continue
                id_sets[topic_id] = topic
            # Persistent maps: O(changed topics) each, however many topics the image holds.
            topics_by_id = as_persistent_map(topics_by_id).updated(id_sets, self._deleted_topics)
            # Names change only with deletions or creations: else every name keeps its id.
            if name_sets or name_deletes:
                topics_by_name = as_persistent_map(topics_by_name).updated(name_sets, name_deletes)

        configs = image.configs
        if self._config_changes:
            config_sets = {key: dict(e) for key, e in self._config_changes.items() if e}
            config_deletes = [k for k, e in self._config_changes.items() if not e and k in configs]
            if config_sets or config_deletes:
                configs = as_persistent_map(configs).updated(config_sets, config_deletes)

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
