"""Image checksums: the SHA-256 every node computes over its image's canonical records, so that
images replayed from the same log can be compared (snapshots, heartbeats, the audit).

Version 2 (default; snapshot format 2): ``msgpack([2, offset, [head records], [topic digests],
[tail records]])`` where head = FeatureLevel and RegisterBroker records, tail = Config,
ProducerIds and LeaderChange records (each ``record.to_dict()``, in ``iter_records`` order), and
one :func:`topic_digest` per topic by name. Version 1 (snapshot format 1): ``msgpack([offset,
[record.to_dict() ...]])``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import msgpack

from kraft.metadata.partition_map import sorted_partition_columns, sorted_partition_items
from kraft.metadata.registrations import PartitionRegistration
from kraft.records import FeatureLevelRecord, PartitionRecord, RegisterBrokerRecord, TopicRecord

if TYPE_CHECKING:
    from kraft.metadata.image import MetadataImage

__all__ = ["CHECKSUM_VERSION", "image_checksum", "topic_digest"]

CHECKSUM_VERSION = 2
"""The definition :meth:`MetadataImage.checksum` computes by default (1 = the legacy one)."""

_HEAD_TYPES = (FeatureLevelRecord, RegisterBrokerRecord)


def topic_digest(
    name: str, topic_id: str, partitions: Mapping[int, PartitionRegistration]
) -> bytes:
    """SHA-256 of ``msgpack([name, topic_id, [partition ids...], [[replicas, isr,
    removing_replicas, adding_replicas, leader, leader_recovery_state, leader_epoch,
    partition_epoch] per partition...]])``, partitions by id (checksum version 2)."""
    pids, regs = sorted_partition_columns(partitions)  # a registration packs as its fields
    return hashlib.sha256(msgpack.packb([name, topic_id, pids, regs], use_bin_type=True)).digest()


def image_checksum(image: MetadataImage, version: int) -> str:
    """Hex SHA-256 of ``image`` by checksum ``version`` (1 or 2; see the module doc). Version 2
    uses the topics' cached digests, so after a small change it costs O(topics)."""
    if version == 1:
        return _checksum_v1(image)
    if version != 2:
        raise ValueError(f"unknown image checksum version {version}")
    head: list[dict[str, Any]] = []
    tail: list[dict[str, Any]] = []
    for record in image.iter_records(with_partitions=False, with_topics=False):
        (head if type(record) in _HEAD_TYPES else tail).append(record.to_dict())
    by_id, by_name = image.topics_by_id, image.topics_by_name
    digests = [by_id[by_name[name]].digest() for name in image.topic_names()]
    payload = msgpack.packb([2, image.offset, head, digests, tail], use_bin_type=True)
    return hashlib.sha256(payload).hexdigest()


def _checksum_v1(image: MetadataImage) -> str:
    """The version 1 checksum, hashed in chunks so memory stays bounded."""
    packer = msgpack.Packer(use_bin_type=True)
    pack = packer.pack
    h = hashlib.sha256()
    h.update(packer.pack_array_header(2))
    h.update(pack(image.offset))
    h.update(packer.pack_array_header(image.record_count()))
    pending: list[bytes] = []
    for item in _iter_record_dicts(image):
        pending.append(pack(item))
        if len(pending) >= 4096:
            h.update(b"".join(pending))
            pending.clear()
    h.update(b"".join(pending))
    return h.hexdigest()


def _iter_record_dicts(image: MetadataImage) -> Iterator[dict[str, Any]]:
    """``r.to_dict() for r in image.iter_records()``, without building the partition records."""
    partition_type, partition_version = PartitionRecord.TYPE, PartitionRecord.VERSION
    for record in image.iter_records(with_partitions=False):
        if type(record) is not TopicRecord:
            yield record.to_dict()
            continue
        yield record.to_dict()
        topic_id = record.topic_id
        for pid, reg in sorted_partition_items(image.topics_by_id[topic_id].partitions):
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
