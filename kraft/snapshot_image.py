"""An image as a format-3 snapshot's body, copying unchanged topics from the previous snapshot.

A topic frame's payload is exactly what the topic's checksum digest hashes
(``kraft.log.snapshot``), so a topic that has not changed since the previous snapshot (its
cached digest is the one that snapshot's frame was written with) need not be packed again: its
frame is copied from that file (its CRC checked; anything that does not match is packed anew).
The bytes are the same either way: a snapshot written with copies is byte-identical to one
written from scratch. :class:`FrameIndex` says where each topic's frame lies in the snapshot
this process wrote last; the writer returns the new file's index.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crc32c import crc32c

from kraft.log.segment import FRAME_HEADER, HEADER_SIZE
from kraft.log.snapshot import (
    SNAPSHOT_FORMAT,
    TOPIC_FRAMES_SINCE,
    Item,
    SnapshotHeader,
    record_chunks,
    snapshot_format_for,
    topic_payload,
    write_snapshot_items,
    write_snapshot_runs,
)
from kraft.metadata.image import MetadataImage
from kraft.metadata.partition_map import sorted_partition_columns
from kraft.records import FeatureLevelRecord, RegisterBrokerRecord

__all__ = ["FrameIndex", "file_identity", "image_header", "write_image_snapshot"]

RequestIds = tuple[tuple[str, dict[str, Any]], ...]
Identity = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns
_HEAD_TYPES = (FeatureLevelRecord, RegisterBrokerRecord)


@dataclass(frozen=True, slots=True)
class FrameIndex:
    """Where a snapshot file holds each topic's frame: topic id -> (digest, payload position,
    payload length), and the file's identity when it was written (a replaced or rewritten file
    is never read as this one)."""

    path: Path
    identity: Identity
    topics: Mapping[str, tuple[bytes, int, int]]

    def to_wire(self) -> list[Any]:
        """Plain values (a forked writer hands the index to its parent as msgpack)."""
        return [
            os.fsencode(self.path),
            list(self.identity),
            [[tid, d, pos, n] for tid, (d, pos, n) in self.topics.items()],
        ]

    @classmethod
    def from_wire(cls, wire: Any) -> FrameIndex:
        """The inverse of :meth:`to_wire`; ValueError on anything else."""
        try:
            path, identity, topics = wire
            ident = tuple(int(v) for v in identity)
            entries = {tid: (d, int(pos), int(n)) for tid, d, pos, n in topics}
        except (TypeError, ValueError) as e:
            raise ValueError(f"not a frame index: {e}") from None
        if len(ident) != 4 or not all(
            type(tid) is str and type(d) is bytes for tid, (d, _, _) in entries.items()
        ):
            raise ValueError("not a frame index")
        return cls(Path(os.fsdecode(path)), ident, entries)


def file_identity(path: Path) -> Identity:
    """What a :class:`FrameIndex` knows its file by (the file must not change after)."""
    return _identity(os.stat(path))


def _identity(st: os.stat_result) -> Identity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class _Previous:
    """The previous snapshot file, mapped, if it is still the file its index describes."""

    def __init__(self, index: FrameIndex) -> None:
        self.index = index
        self._map: mmap.mmap | None = None
        try:
            with open(index.path, "rb") as f:
                if _identity(os.fstat(f.fileno())) == index.identity and index.identity[2] > 0:
                    self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError:
            self._map = None

    def payload(self, topic_id: str, digest: bytes) -> bytes | None:
        """The topic's frame payload if the index has it with this digest and its CRC checks."""
        m = self._map
        entry = self.index.topics.get(topic_id)
        if m is None or entry is None or entry[0] != digest:
            return None
        _, position, length = entry
        if position < HEADER_SIZE or position + length > len(m):
            return None
        framed_length, crc = FRAME_HEADER.unpack_from(m, position - HEADER_SIZE)
        if framed_length != length:
            return None
        payload = m[position : position + length]
        return payload if crc32c(payload) == crc else None

    def close(self) -> None:
        if self._map is not None:
            self._map.close()


def write_image_snapshot(
    directory: Path,
    image: MetadataImage,
    request_ids: RequestIds = (),
    previous: FrameIndex | None = None,
) -> tuple[Path, FrameIndex, int]:
    """Write ``image`` (and the dedup window at its offset) as a snapshot in ``directory``,
    copying from ``previous`` the frames of topics whose cached digest it holds; returns the
    path, the new file's frame index and how many topic frames were copied. Topic digests
    computed on the way are cached on the image's topics (as ``TopicImage.digest`` does).
    A cluster whose ``metadata.version`` predates format 3 gets a format-2 file (no frames to
    copy, an empty index): its older nodes could not read format 3."""
    if snapshot_format_for(image.features) < TOPIC_FRAMES_SINCE:
        header = image_header(image, request_ids)
        path = write_snapshot_runs(directory, header, image.record_runs())
        return path, FrameIndex(path, file_identity(path), {}), 0
    source = _Previous(previous) if previous is not None else None
    try:
        topics: list[tuple[str, bytes, bytes, int]] = []  # (id, digest, payload, records)
        copied = 0
        by_id, by_name = image.topics_by_id, image.topics_by_name
        for name in image.topic_names():
            topic_id = by_name[name]
            topic = by_id[topic_id]
            digest = topic._digest
            payload = None
            if source is not None and digest is not None:
                payload = source.payload(topic_id, digest)
            if payload is None:
                payload = topic_payload(name, topic_id, *sorted_partition_columns(topic.partitions))
                digest = hashlib.sha256(payload).digest()
                if topic._digest is None:
                    object.__setattr__(topic, "_digest", digest)
            else:
                copied += 1
            topics.append((topic_id, digest, payload, 1 + len(topic.partitions)))  # type: ignore[arg-type]  # digest is set on both paths
        header = image_header(image, request_ids, SNAPSHOT_FORMAT)
        path, positions = write_snapshot_items(directory, header, _items(image, topics))
    finally:
        if source is not None:
            source.close()
    index = FrameIndex(
        path,
        _identity(os.stat(path)),
        {
            topic_id: (digest, position, len(payload))
            for (topic_id, digest, payload, _), position in zip(topics, positions)
        },
    )
    return path, index, copied


def image_header(
    image: MetadataImage, request_ids: RequestIds = (), fmt: int | None = None
) -> SnapshotHeader:
    """The header of a snapshot of ``image`` (``fmt``: the format, else the one its features
    allow, ``snapshot_format_for``)."""
    return SnapshotHeader(
        end_offset=image.offset + 1,
        term=image.term,
        raft_index=image.raft_index,
        timestamp_ms=image.timestamp_ms,
        last_hash=image.last_hash,
        record_count=image.record_count(),
        image_checksum=image.checksum(),
        request_ids=tuple(request_ids),
        format=snapshot_format_for(image.features) if fmt is None else fmt,
    )


def _items(image: MetadataImage, topics: list[tuple[str, bytes, bytes, int]]) -> Iterator[Item]:
    rest = list(image.iter_records(with_partitions=False, with_topics=False))
    yield from record_chunks(r for r in rest if type(r) in _HEAD_TYPES)
    for _, _, payload, records in topics:
        yield payload, records
    yield from record_chunks(r for r in rest if type(r) not in _HEAD_TYPES)
