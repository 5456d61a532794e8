"""Replay: the one way an image is rebuilt from the log, for every reader of it.

:func:`replay` takes the image a snapshot gave (or ``MetadataImage.EMPTY``) and the log's batches
after it, and returns the image they make; :func:`replay_into` does the same into a delta a
caller keeps open (the broker publishes a delta, not just an image). :func:`image_from_records`
rebuilds a snapshot's image from its records. All three are pure: no I/O, no clock.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from kraft.metadata.delta import MetadataDelta, ReplayError
from kraft.metadata.image import MetadataImage, TopicImage
from kraft.metadata.partition_map import PartitionMap
from kraft.metadata.persistent_map import as_persistent_map
from kraft.metadata.registrations import PartitionRegistration, new_registration
from kraft.records import (
    ZERO_HASH,
    Batch,
    ConfigRecord,
    FeatureLevelRecord,
    LeaderChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    Record,
    RegisterBrokerRecord,
    TopicRecord,
)

__all__ = ["image_from_records", "replay", "replay_into"]


BeforeBatch = Callable[[Batch, MetadataDelta], None]


def replay_into(
    delta: MetadataDelta, batches: Iterable[Batch], before_batch: BeforeBatch | None = None
) -> int:
    """Replay into ``delta`` every batch of ``batches`` it does not hold yet (one ending at or
    before ``delta.offset`` is skipped: a snapshot or an earlier fetch covered it); returns how
    many were replayed. Each batch must continue the chain (offset and hash) or
    ``ReplayError`` is raised. A batch's ``digest`` (set by the decoders) is the hash adopted;
    a batch without one is encoded to hash it. ``before_batch(batch, delta)``, if given, sees
    each new batch with the delta still just before it (the controller's dedup window names
    what a batch removed)."""
    n = 0
    replay_batch = delta.replay_batch
    for batch in batches:
        if batch.last_offset <= delta.offset:
            continue
        if before_batch is not None:
            before_batch(batch, delta)
        replay_batch(batch)
        n += 1
    return n


def replay(
    snapshot: MetadataImage, batches: Iterable[Batch], before_batch: BeforeBatch | None = None
) -> MetadataImage:
    """The image ``snapshot`` (a loaded snapshot's image, or ``MetadataImage.EMPTY``) becomes
    once ``batches`` (the log after it, in order) are replayed; see :func:`replay_into`. Raises
    ``ReplayError`` on a batch that does not continue the log. ``snapshot`` itself when no batch
    is new."""
    delta = MetadataDelta(snapshot)
    if not replay_into(delta, batches, before_batch):
        return snapshot
    return delta.apply()


@contextmanager
def _gc_paused(freeze: bool = False) -> Iterator[None]:
    """Pause the cyclic garbage collector: building an image allocates up to millions of acyclic
    objects, and every collection on the way would rescan all of them (~20% of a load).
    ``freeze``: collect what is garbage first (so no garbage cycle alive now becomes permanent),
    and on success move every object alive to the collector's permanent generation
    (``gc.freeze``) before collection resumes, so the new image is never scanned at all."""
    enabled = gc.isenabled()
    if freeze:
        gc.collect()
    gc.disable()
    try:
        yield
        if freeze:
            gc.freeze()
    finally:
        if enabled:
            gc.enable()


def _created_partitions(delta: MetadataDelta, topic_id: str) -> dict[int, PartitionRegistration]:
    """The (so far empty) partitions of the topic ``delta`` just created: a topic frame's
    partitions go there in one C-level update, as ``replay_partition_rows`` would put them."""
    return delta._topic_changes[topic_id].partitions


# Record types a snapshot holds besides its topics: none of them can change a topic, so topic
# digests taken from a snapshot's topic frames still describe the topics once these replayed.
_TOPIC_NEUTRAL = frozenset(
    {FeatureLevelRecord, RegisterBrokerRecord, ConfigRecord, ProducerIdsRecord, LeaderChangeRecord}
)


def image_from_records(
    records: Iterable[Record],
    *,
    offset: int,
    term: int = 0,
    raft_index: int = 0,
    timestamp_ms: int = 0,
    last_hash: bytes = ZERO_HASH,
    freeze: bool = False,
    adopt_digests: bool = False,
) -> MetadataImage:
    """Build an image from a snapshot's records (as written by ``MetadataImage.iter_records``),
    positioned at ``offset`` (the last offset the snapshot includes).

    If ``records`` also offers ``iter_items()`` or ``iter_chunks()`` (as
    ``kraft.log.snapshot.read_snapshot``'s records do), it is read as chunks ``(record class,
    rows of checked field values)`` and topic frames (``name, topic_id, partition_ids,
    registrations, digest``), whose partitions become registrations directly, without record
    objects.

    ``adopt_digests=True`` (for a caller that then compares the image's checksum with the
    snapshot header's, as ``kraft.snapshotter.snapshot_state`` does): each topic read from a
    topic frame keeps that frame's SHA-256 as its cached digest, so the checksum costs
    O(topics) instead of packing every partition again. That check is still complete: the
    header's checksum holds the digests of the image written, and a frame hashes to one only
    if it is byte for byte that topic's canonical encoding, so it decodes to that very topic. A
    snapshot holding any record that could change a topic besides its topic frames (any type
    but those of ``_TOPIC_NEUTRAL``) adopts none.

    ``freeze=True`` (for a process that keeps the image, e.g. a broker): ``gc.freeze()`` once
    it is built. The image is acyclic and immutable, so the collector has nothing to find in
    it, yet would otherwise walk its millions of objects on the first collection after the load
    (~0.4 s per million partitions) and on every full collection after that (~0.3 s each, on
    the event loop). Objects that die later are still freed by reference counting."""
    delta = MetadataDelta(MetadataImage.EMPTY)
    replay_record = delta.replay
    iter_items = getattr(records, "iter_items", None) or getattr(records, "iter_chunks", None)
    # Topic frames are built straight into TopicImages at the end, unless a record that could
    # touch a topic comes along: then those so far are replayed into the delta, in file order,
    # and so is everything after (the same image either way, the delta's checks included).
    frames: list[Any] = []
    direct = True
    with _gc_paused(freeze):
        if iter_items is not None:
            for item in iter_items():
                if type(item) is not tuple:  # a topic frame
                    if direct:
                        frames.append(item)
                    else:
                        _replay_frame(delta, item)
                    continue
                cls, rows = item
                if direct and cls not in _TOPIC_NEUTRAL:
                    direct = False
                    for frame in frames:
                        _replay_frame(delta, frame)
                    frames = []
                if cls is PartitionRecord:
                    delta.replay_partition_rows(rows)
                else:
                    for row in rows:
                        replay_record(cls(*row))
        else:
            for record in records:
                replay_record(record)
        delta.set_provenance(
            offset=offset,
            term=term,
            raft_index=raft_index,
            timestamp_ms=timestamp_ms,
            last_hash=last_hash,
        )
        image = delta.apply()
        if frames:
            image = _with_topics(image, frames, adopt_digests)
        return image


def _replay_frame(delta: MetadataDelta, frame: Any) -> None:
    """A topic frame as its TopicRecord and PartitionRecords, replayed into ``delta``."""
    name, topic_id, ids, regs, _ = frame
    delta.replay(TopicRecord(name, topic_id))
    _created_partitions(delta, topic_id).update(zip(ids, map(new_registration, regs)))


def _with_topics(image: MetadataImage, frames: list[Any], adopt_digests: bool) -> MetadataImage:
    """``image`` (no topics: only records that cannot touch one were replayed) with the topics
    of ``frames``, built directly; the same checks as replaying their TopicRecords."""
    by_id: dict[str, TopicImage] = {}
    by_name: dict[str, str] = {}
    for name, topic_id, ids, regs, digest in frames:
        if topic_id in by_id:
            raise ReplayError(f"TopicRecord: topic id {topic_id} already exists")
        if name in by_name:
            raise ReplayError(f"TopicRecord: topic name {name!r} already exists")
        topic = TopicImage(
            name, topic_id, PartitionMap.of_columns(ids, map(new_registration, regs))
        )
        if adopt_digests:
            object.__setattr__(topic, "_digest", digest)
        by_id[topic_id] = topic
        by_name[name] = topic_id
    return MetadataImage(
        image.offset,
        image.term,
        image.raft_index,
        image.timestamp_ms,
        image.last_hash,
        image.features,
        image.brokers,
        as_persistent_map(by_id),
        as_persistent_map(by_name),
        image.configs,
        image.next_producer_id,
        image.controller_id,
    )
