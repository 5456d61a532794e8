"""Snapshot files: a point-in-time image written as records, independent of the image class.

File ``<dir>/%020d-%010d.checkpoint`` (end offset = last included offset + 1, term), written as
``<name>.part``, fsynced, renamed, directory fsynced. Content, every part framed like the log
(``u32 length | u32 crc32c | payload``):

1. header map ``{kind: "header", format, end_offset, term, raft_index, timestamp_ms, last_hash,
   record_count, image_checksum}``; ``image_checksum`` is ``MetadataImage.checksum`` of the
   version :attr:`SnapshotHeader.checksum_version` names (format 1: version 1, 2 and 3: version 2)
2. body frames, each either
   - a record chunk, a map ``{type, version, fields: [names], rows: [[values], ...]}`` holding
     up to :data:`CHUNK_RECORDS` consecutive records of one type (field names once per chunk);
   - (format 3) a topic frame, an array ``[name, topic_id, [partition ids], [[replicas, isr,
     removing_replicas, adding_replicas, leader, leader_recovery_state, leader_epoch,
     partition_epoch], ...]]``: a TopicRecord and its PartitionRecords (ids ascending), packed
     exactly as the topic's checksum-version-2 digest packs them, so that the SHA-256 of the
     frame's payload *is* the topic's digest (``kraft.metadata.checksum.topic_digest``): a
     reader verifies the image checksum without packing anything again, and a writer copies an
     unchanged topic's frame from the previous snapshot (``kraft.snapshot_image``). Formats 1 and
     2 hold record chunks only (a topic's partitions as rows ``[pid, topic_id, ...]``).
3. footer map ``{kind: "footer", record_count, sha256}``; ``sha256`` covers every preceding
   frame payload in order.

Reading verifies all CRCs, the footer checksum and the counts before handing out records; records
are decoded lazily, chunk by chunk, every value checked against the field kinds of
:mod:`kraft.records` (column-wise for the plain kinds, so a chunk of 1000 PartitionRecords costs a
few C-level passes). ``SnapshotRecords.iter_chunks`` hands out the checked rows without building
record objects; ``iter_items`` hands out topic frames whole, with their hash
(``kraft.metadata.replay.image_from_records`` uses them).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from itertools import chain, islice
from operator import attrgetter, itemgetter, lt
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import msgpack

from kraft.log.errors import CorruptSnapshotError
from kraft.log.segment import FRAME_HEADER, HEADER_SIZE, frame_header, fsync_dir, iter_frames
from kraft.records import (
    BOOL,
    INT,
    INTS,
    OPT_INT,
    OPT_INTS,
    OPT_STR,
    RECORD_TYPES,
    STR,
    PartitionRecord,
    Record,
    RecordDecodeError,
    TopicRecord,
)

log = logging.getLogger(__name__)

SNAPSHOT_FORMAT = 3
READABLE_FORMATS = (1, 2, 3)
CHECKSUM_VERSIONS = {1: 1, 2: 2, 3: 2}  # snapshot format -> the image checksum version it holds
TOPIC_FRAMES_SINCE = 3  # the first format with topic frames
CHUNK_RECORDS = 1000
Row = tuple[Any, ...]  # one record's field values, in ``FIELDS`` order
SUFFIX = ".checkpoint"
PART_SUFFIX = ".checkpoint.part"
DELETED_SUFFIX = ".checkpoint.deleted"
_NAME_RE = re.compile(r"^(\d{20})-(\d{10})\.checkpoint$")
_HEADER_INTS = ("format", "end_offset", "term", "raft_index", "timestamp_ms", "record_count")


@dataclass(frozen=True, slots=True)
class SnapshotHeader:
    """What a snapshot covers. ``image_checksum`` is the image's own checksum (caller's)."""

    end_offset: int
    term: int
    raft_index: int
    timestamp_ms: int
    last_hash: bytes
    record_count: int
    image_checksum: str
    format: int = SNAPSHOT_FORMAT
    # The controller's dedup window at this offset: (request id, answer) pairs, oldest first.
    # Optional (older snapshots lack it); not part of the image or its checksum.
    request_ids: tuple[tuple[str, dict[str, Any]], ...] = ()

    @property
    def name(self) -> str:
        return snapshot_name(self.end_offset, self.term)

    @property
    def checksum_version(self) -> int:
        """The ``MetadataImage.checksum`` version that ``image_checksum`` holds."""
        return CHECKSUM_VERSIONS[self.format]

    def to_dict(self) -> dict[str, Any]:
        # Shallow on purpose: ``asdict`` would deep-copy the whole dedup window (10k answers),
        # ~half the CPU of a small snapshot, holding the GIL the controller's commit path needs.
        d: dict[str, Any] = {"kind": "header"}
        for f in fields(self):
            d[f.name] = getattr(self, f.name)
        d["request_ids"] = [[rid, answer] for rid, answer in self.request_ids]
        return d

    @classmethod
    def from_dict(cls, d: Any) -> SnapshotHeader:
        """Strictly decode a header map; raises ValueError naming the problem."""
        if not isinstance(d, dict) or d.get("kind") != "header":
            raise ValueError("first frame is not a snapshot header")
        for key in _HEADER_INTS:
            if type(d.get(key)) is not int:
                raise ValueError(f"header {key} must be an integer, got {d.get(key)!r}")
        if d["format"] not in READABLE_FORMATS:
            raise ValueError(f"unsupported snapshot format {d['format']}")
        if type(d.get("last_hash")) is not bytes or type(d.get("image_checksum")) is not str:
            raise ValueError("header last_hash must be bytes and image_checksum a string")
        pairs = d.get("request_ids", [])
        if not isinstance(pairs, list) or not all(
            isinstance(p, list) and len(p) == 2 and type(p[0]) is str and isinstance(p[1], dict)
            for p in pairs
        ):
            raise ValueError("header request_ids must be a list of [request id, answer] pairs")
        return cls(
            d["end_offset"],
            d["term"],
            d["raft_index"],
            d["timestamp_ms"],
            d["last_hash"],
            d["record_count"],
            d["image_checksum"],
            d["format"],
            tuple((rid, answer) for rid, answer in pairs),
        )


# ------------------------------------------------------------------------------ names


def snapshot_name(end_offset: int, term: int) -> str:
    """``%020d-%010d.checkpoint``."""
    return f"{end_offset:020d}-{term:010d}{SUFFIX}"


def parse_snapshot_name(path: str | Path) -> tuple[int, int]:
    """``(end_offset, term)`` from a snapshot file name; ValueError if it is not one."""
    m = _NAME_RE.match(Path(path).name)
    if not m:
        raise ValueError(f"not a snapshot file name: {Path(path).name}")
    return int(m.group(1)), int(m.group(2))


def list_snapshots(directory: str | Path) -> list[Path]:
    """Complete snapshots in ``directory`` sorted by (end offset, term). Leftover ``.part`` and
    ``.deleted`` files from an interrupted write or delete are removed with a warning."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found: list[tuple[tuple[int, int], Path]] = []
    for p in d.iterdir():
        if p.name.endswith((PART_SUFFIX, DELETED_SUFFIX)):
            log.warning("removing leftover snapshot file %s", p)
            p.unlink(missing_ok=True)
        elif _NAME_RE.match(p.name):
            found.append((parse_snapshot_name(p), p))
    return [p for _, p in sorted(found)]


def latest_snapshot(directory: str | Path) -> Path | None:
    """The snapshot with the highest end offset, or None."""
    snaps = list_snapshots(directory)
    return snaps[-1] if snaps else None


def delete_snapshots_before(directory: str | Path, end_offset: int) -> list[Path]:
    """Delete snapshots whose end offset is below ``end_offset`` (renamed to ``.deleted``
    first, as Kafka does). Returns the deleted paths."""
    deleted = []
    for p in list_snapshots(directory):
        if parse_snapshot_name(p)[0] < end_offset:
            gone = p.with_name(p.name + ".deleted")
            os.replace(p, gone)
            gone.unlink()
            deleted.append(p)
            log.info("retention: deleted snapshot %s", p)
    if deleted:
        fsync_dir(directory)
    return deleted


# ------------------------------------------------------------------------------ writing


Item = dict[str, Any] | tuple[bytes, int]
"""A body frame to write: a record chunk map (packed by the writer), or a topic frame's payload
already packed (:func:`topic_payload`) with how many records it holds (1 + its partitions)."""


def topic_payload(
    name: str, topic_id: str, partition_ids: list[int], registrations: Sequence[Sequence[Any]]
) -> bytes:
    """A topic frame's payload: ``msgpack([name, topic_id, [ids], [[8 values], ...]])``, ids
    ascending; its SHA-256 is the topic's checksum-version-2 digest."""
    payload: bytes = msgpack.packb(
        [name, topic_id, partition_ids, registrations], use_bin_type=True
    )
    return payload


def write_snapshot(
    directory: str | Path, header: SnapshotHeader, records: Iterable[Record]
) -> Path:
    """Write ``records`` (exactly ``header.record_count`` of them) as a snapshot in
    ``header.format``; returns its path. Atomic: nothing named ``*.checkpoint`` exists until
    the file is complete and synced."""
    if header.format >= TOPIC_FRAMES_SINCE:
        return _write(directory, header, _topic_items(_record_runs(records)))[0]
    return _write(directory, header, _chunks(records))[0]


def write_snapshot_runs(
    directory: str | Path,
    header: SnapshotHeader,
    runs: Iterable[tuple[type[Record], Iterable[Row]]],
) -> Path:
    """:func:`write_snapshot` of records given as runs ``(record class, rows)``, each row the
    values of ``cls.FIELDS`` in order (e.g. ``MetadataImage.record_runs()``): the same bytes as
    writing the records themselves, without building record objects."""
    if header.format >= TOPIC_FRAMES_SINCE:
        return _write(directory, header, _topic_items(runs))[0]
    return _write(directory, header, _run_chunks(runs))[0]


def write_snapshot_items(
    directory: str | Path, header: SnapshotHeader, items: Iterable[Item]
) -> tuple[Path, list[int]]:
    """Write body frames given as :data:`Item` s (format 3), e.g. topic frames copied from an
    earlier snapshot; returns the path and, per topic frame in order, its payload's position in
    the file. The bytes are those of :func:`write_snapshot` of the same records."""
    if header.format < TOPIC_FRAMES_SINCE:
        raise ValueError(f"snapshot format {header.format} has no topic frames")
    return _write(directory, header, iter(items))


def _write(
    directory: str | Path, header: SnapshotHeader, items: Iterator[Item]
) -> tuple[Path, list[int]]:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    final = d / header.name
    part = d / (header.name + ".part")
    try:
        with open(part, "wb", buffering=1 << 20) as f:
            positions = _write_body(f, header, items)
            f.flush()
            os.fsync(f.fileno())
        os.replace(part, final)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    fsync_dir(d)
    return final, positions


def _write_body(f: BinaryIO, header: SnapshotHeader, items: Iterator[Item]) -> list[int]:
    sha = hashlib.sha256()
    position = 0
    positions: list[int] = []

    def put(payload: bytes) -> None:
        nonlocal position
        f.write(frame_header(payload))
        f.write(payload)
        sha.update(payload)
        position += HEADER_SIZE + len(payload)

    put(msgpack.packb(header.to_dict(), use_bin_type=True))
    count = 0
    for item in items:
        if isinstance(item, dict):
            put(msgpack.packb(item, use_bin_type=True))
            count += len(item["rows"])
        else:
            payload, records = item
            positions.append(position + HEADER_SIZE)
            put(payload)
            count += records
    if count != header.record_count:
        raise ValueError(f"header says {header.record_count} records, {count} were given")
    footer = {"kind": "footer", "record_count": count, "sha256": sha.digest()}
    payload = msgpack.packb(footer, use_bin_type=True)
    f.write(frame_header(payload))
    f.write(payload)
    return positions


def _no_values(r: Record) -> Row:
    return ()


def _record_runs(records: Iterable[Record]) -> Iterator[tuple[type[Record], list[Row]]]:
    """Consecutive records of one type as runs ``(class, rows)``."""
    cls: type[Record] | None = None
    getter: Callable[[Record], Row] = _no_values  # replaced with the first record's type
    rows: list[Row] = []
    for record in records:
        if type(record) is not cls:
            if cls is not None:
                yield cls, rows
            cls, rows = type(record), []
            getter = _row_getter(cls)
        rows.append(getter(record))
    if cls is not None:
        yield cls, rows


def record_chunks(records: Iterable[Record]) -> Iterator[Item]:
    """Record chunk items of ``records`` (for :func:`write_snapshot_items`)."""
    return _run_chunks(_record_runs(records))


_ids = itemgetter(0)
_topic_ids = itemgetter(1)
_registration = itemgetter(slice(2, None))


def _topic_items(runs: Iterable[tuple[type[Record], Iterable[Row]]]) -> Iterator[Item]:
    """Format 3 body items of runs: each TopicRecord becomes a topic frame together with the
    PartitionRecord run right after it when that run is all of its topic with ids ascending;
    every other record goes into record chunks (:func:`_run_chunks`)."""
    plain: list[tuple[type[Record], list[Row]]] = []
    topic: Row | None = None  # a TopicRecord row waiting for its partitions
    for cls, run in runs:
        rows = list(run)
        if not rows:
            continue
        if topic is not None:
            if cls is PartitionRecord and _whole_topic(rows, topic[1]):
                ids = list(map(_ids, rows))
                yield (
                    topic_payload(topic[0], topic[1], ids, list(map(_registration, rows))),
                    1 + len(rows),
                )
                topic = None
                continue
            yield topic_payload(topic[0], topic[1], [], []), 1
            topic = None
        if cls is TopicRecord:
            yield from _run_chunks(plain)
            plain = []
            for row in rows[:-1]:
                yield topic_payload(row[0], row[1], [], []), 1
            topic = rows[-1]
        else:
            plain.append((cls, rows))
    if topic is not None:
        yield topic_payload(topic[0], topic[1], [], []), 1
    yield from _run_chunks(plain)


def _whole_topic(rows: list[Row], topic_id: str) -> bool:
    """Whether PartitionRecord ``rows`` all belong to ``topic_id``, partition ids ascending."""
    if set(map(_topic_ids, rows)) != {topic_id}:
        return False
    ids = list(map(_ids, rows))
    return all(map(lt, ids, islice(ids, 1, None)))


def _row_getter(cls: type[Record]) -> Callable[[Record], Row]:
    names = [n for n, _ in cls.FIELDS]
    if not names:
        return lambda r: ()
    if len(names) == 1:
        name = names[0]

        def one(r: Record) -> Row:
            return (getattr(r, name),)

        return one
    getter: Callable[[Record], Row] = attrgetter(*names)
    return getter


def _chunks(records: Iterable[Record]) -> Iterator[dict[str, Any]]:
    """Runs of up to CHUNK_RECORDS consecutive records of one type, as row chunks."""
    it = iter(records)
    pending: Record | None = next(it, None)
    while pending is not None:
        cls = type(pending)
        getter = _row_getter(cls)
        rows = [getter(pending)]
        pending = None
        for rec in islice(it, CHUNK_RECORDS - 1):
            if type(rec) is not cls:
                pending = rec
                break
            rows.append(getter(rec))
        else:
            pending = next(it, None)
        yield {
            "type": cls.TYPE,
            "version": cls.VERSION,
            "fields": [n for n, _ in cls.FIELDS],
            "rows": rows,
        }


def _run_chunks(runs: Iterable[tuple[type[Record], Iterable[Row]]]) -> Iterator[dict[str, Any]]:
    """Row chunks of runs: consecutive runs of one type are joined, then cut every CHUNK_RECORDS
    rows, exactly as :func:`_chunks` cuts the same records."""
    cls: type[Record] | None = None
    rows: list[Row] = []
    for run_cls, run_rows in runs:
        run_rows = list(run_rows)
        if not run_rows:  # an empty run must not split the runs around it
            continue
        if run_cls is not cls:
            if cls is not None and rows:
                yield _chunk(cls, rows)
            cls, rows = run_cls, []
        rows.extend(run_rows)
        while len(rows) >= CHUNK_RECORDS:
            yield _chunk(cls, rows[:CHUNK_RECORDS])
            del rows[:CHUNK_RECORDS]
    if cls is not None and rows:
        yield _chunk(cls, rows)


def _chunk(cls: type[Record], rows: list[Row]) -> dict[str, Any]:
    return {
        "type": cls.TYPE,
        "version": cls.VERSION,
        "fields": [n for n, _ in cls.FIELDS],
        "rows": rows,
    }


# ------------------------------------------------------------------------------ reading


def read_snapshot_header(path: str | Path) -> SnapshotHeader:
    """Only the header (CRC-checked), e.g. to list snapshots; does not verify the body."""
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(HEADER_SIZE)
        if len(head) == HEADER_SIZE:
            length, _ = FRAME_HEADER.unpack(head)
            data = head + f.read(length)
        else:
            data = head
    frame = next(iter_frames(data), None)
    return _parse_header(path, frame)


def read_snapshot(
    path: str | Path, strict: bool = True, unchecked_partitions: bool = False
) -> tuple[SnapshotHeader, SnapshotRecords]:
    """Verify a snapshot (CRCs, structure, footer checksum and count) and return its header and
    a lazy iterator of its records. Raises CorruptSnapshotError (records: while iterating).

    ``strict=False`` skips the per-field type checks of each record (about twice as fast): the
    footer SHA-256 already proves the bytes are exactly what a pykraft writer produced from typed
    records; record type, version and field names are still checked per chunk.
    ``unchecked_partitions=True`` skips them for PartitionRecord chunks only (the bulk of a big
    snapshot; their shape is still checked): for a caller that then compares the image's
    ``MetadataImage.checksum`` with the header's, which covers the exact encoding of every
    partition value (``broker.metadata.checkpoint.image_from_snapshot``)."""
    path = Path(path)
    data = path.read_bytes()
    frames = list(iter_frames(data))
    if not frames:
        raise CorruptSnapshotError(path, 0, "empty file")
    sha = hashlib.sha256()
    payloads: list[memoryview] = []  # views of ``data``: no copy
    for fr in frames:
        if fr.payload is None:
            raise CorruptSnapshotError(path, fr.position, "truncated frame")
        if not fr.crc_ok:
            raise CorruptSnapshotError(path, fr.position, "CRC mismatch")
        payloads.append(fr.payload)
    header = _parse_header(path, frames[0])
    if len(frames) < 2:
        raise CorruptSnapshotError(path, len(data), "no footer")
    for payload in payloads[:-1]:
        sha.update(payload)
    footer = _unpack(path, frames[-1].position, payloads[-1])
    if not isinstance(footer, dict) or footer.get("kind") != "footer":
        raise CorruptSnapshotError(path, frames[-1].position, "last frame is not a footer")
    if footer.get("sha256") != sha.digest():
        raise CorruptSnapshotError(path, frames[-1].position, "footer SHA-256 does not match")
    if footer.get("record_count") != header.record_count:
        raise CorruptSnapshotError(
            path,
            frames[-1].position,
            f"footer count {footer.get('record_count')} != header count {header.record_count}",
        )
    body = [(fr.position, payload) for fr, payload in zip(frames[1:-1], payloads[1:-1])]
    unchecked = frozenset({PartitionRecord.TYPE}) if unchecked_partitions else frozenset()
    return header, SnapshotRecords(
        path,
        body,
        header.record_count,
        frames[-1].position,
        strict,
        unchecked,
        topic_frames=header.format >= TOPIC_FRAMES_SINCE,
    )


def _parse_header(path: Path, frame: Any) -> SnapshotHeader:
    if frame is None or frame.payload is None:
        raise CorruptSnapshotError(path, 0, "truncated header frame")
    if not frame.crc_ok:
        raise CorruptSnapshotError(path, 0, "CRC mismatch in header")
    try:
        header = SnapshotHeader.from_dict(_unpack(path, 0, frame.payload))
    except ValueError as e:
        raise CorruptSnapshotError(path, 0, str(e)) from None
    try:
        named = parse_snapshot_name(path)
    except ValueError:
        return header  # a copy under another name: nothing to compare
    if named != (header.end_offset, header.term):
        raise CorruptSnapshotError(
            path,
            0,
            f"name says (end offset, term) {named}, header says {(header.end_offset, header.term)}",
        )
    return header


def _unpack(path: Path, position: int, payload: Any, use_list: bool = True) -> Any:
    try:
        return msgpack.unpackb(payload, raw=False, strict_map_key=False, use_list=use_list)
    except Exception as e:  # msgpack raises several unrelated types
        raise CorruptSnapshotError(path, position, f"not msgpack: {e}") from None


class TopicFrame(NamedTuple):
    """A topic frame as read (format 3): the topic, its partitions' ids and registration values
    (8-tuples in ``PartitionRegistration`` order), and the SHA-256 of the frame's payload (the
    topic's digest when the frame is canonical, which the image checksum then proves)."""

    name: str
    topic_id: str
    partition_ids: tuple[int, ...]
    registrations: tuple[Row, ...]
    digest: bytes


_TOPIC_FRAME_START = b"\x94"  # a msgpack array of 4: how every topic frame's payload begins


class SnapshotRecords(Iterator[Record]):
    """The records of a verified snapshot: an iterator of records, decoded chunk by chunk.

    A chunk that does not decode or check raises CorruptSnapshotError naming the file and the
    chunk's position, when iteration reaches it; so does a record count that differs from the
    header's, at the end."""

    def __init__(
        self,
        path: Path,
        body: list[tuple[int, memoryview]],
        expected: int,
        footer_pos: int,
        strict: bool,
        unchecked_types: frozenset[int] = frozenset(),
        topic_frames: bool = False,
    ) -> None:
        self._path, self._body, self._expected = path, body, expected
        self._footer_pos, self._strict, self._unchecked = footer_pos, strict, unchecked_types
        self._topic_frames = topic_frames
        self._records: Iterator[Record] | None = None
        # Per topic frame read so far: topic id -> (its payload's SHA-256, position, length).
        self.topic_frames: dict[str, tuple[bytes, int, int]] = {}

    def iter_chunks(self) -> Iterator[tuple[type[Record], tuple[Row, ...]]]:
        """``(record class, rows)`` per chunk, each row the values of ``cls.FIELDS`` in order
        (checked when strict), ready for ``cls(*row)``; a topic frame gives its TopicRecord
        chunk, then its PartitionRecord chunk (when it has partitions)."""
        for item in self.iter_items():
            if type(item) is TopicFrame:
                topic_id = item.topic_id
                yield TopicRecord, ((item.name, topic_id),)
                if item.partition_ids:
                    yield (
                        PartitionRecord,
                        tuple(
                            (pid, topic_id, *values)
                            for pid, values in zip(item.partition_ids, item.registrations)
                        ),
                    )
            else:
                yield item  # type: ignore[misc]  # the other item: (record class, rows)

    def iter_items(self) -> Iterator[tuple[type[Record], tuple[Row, ...]] | TopicFrame]:
        """Like :meth:`iter_chunks`, but a topic frame as one :class:`TopicFrame` (format 3),
        whose rows are not built: ``kraft.metadata.replay.image_from_records`` builds the
        partitions from it directly and takes its digest."""
        count = 0
        shapes = PartitionRecord.TYPE not in self._unchecked  # else proven by the checksum
        values = self._strict and shapes
        for position, payload in self._body:
            if self._topic_frames and payload[:1] == _TOPIC_FRAME_START:
                frame = _unpack(self._path, position, payload, use_list=False)
                try:
                    topic = _decode_topic(frame, shapes, values, payload)
                except (RecordDecodeError, TypeError) as e:
                    raise CorruptSnapshotError(
                        self._path, position, f"bad topic frame: {e}"
                    ) from None
                count += 1 + len(topic.partition_ids)
                self.topic_frames[topic.topic_id] = (
                    topic.digest,
                    position + HEADER_SIZE,
                    len(payload),
                )
                yield topic
                continue
            chunk = _unpack(self._path, position, payload, use_list=False)
            try:
                strict = self._strict and not (
                    type(chunk) is dict and chunk.get("type") in self._unchecked
                )
                cls, rows = _decode_rows(chunk, strict)
            except (RecordDecodeError, TypeError) as e:
                raise CorruptSnapshotError(self._path, position, f"bad record chunk: {e}") from None
            count += len(rows)
            yield cls, rows
        if count != self._expected:
            raise CorruptSnapshotError(
                self._path, self._footer_pos, f"{count} records, header says {self._expected}"
            )

    def __iter__(self) -> SnapshotRecords:
        return self

    def __next__(self) -> Record:
        if self._records is None:
            self._records = (cls(*row) for cls, rows in self.iter_chunks() for row in rows)
        return next(self._records)


_REGISTRATION_KINDS = tuple(kind for _, kind in PartitionRecord.FIELDS[2:])
_REGISTRATION_NAMES = tuple(name for name, _ in PartitionRecord.FIELDS[2:])


def _decode_topic(frame: Any, shapes: bool, values: bool, payload: memoryview) -> TopicFrame:
    """Check a topic frame's outline, and when asked every registration's shape (8 values) and
    every value's type, and hash its payload."""
    if type(frame) is not tuple or len(frame) != 4:
        raise RecordDecodeError("not a topic frame [name, topic_id, ids, registrations]")
    name, topic_id, ids, regs = frame
    if type(name) is not str or type(topic_id) is not str:
        raise RecordDecodeError(f"topic name and id must be strings, got {name!r}, {topic_id!r}")
    if type(ids) is not tuple or type(regs) is not tuple or len(ids) != len(regs):
        raise RecordDecodeError(f"topic {name!r}: partition ids and registrations do not pair")
    if shapes and (
        set(map(type, regs)) - {tuple} or set(map(len, regs)) - {len(_REGISTRATION_KINDS)}
    ):
        raise RecordDecodeError(f"topic {name!r}: a registration does not have 8 values")
    if values and ids:
        if not set(map(type, ids)) <= _INT_ONLY:
            i = next(i for i, v in enumerate(ids) if type(v) is not int)
            raise RecordDecodeError(
                f"topic {name!r} partition {ids[i]!r}: PartitionRecord.partition_id must be an "
                f"integer, got {ids[i]!r}"
            )
        for field, kind, column in zip(_REGISTRATION_NAMES, _REGISTRATION_KINDS, zip(*regs)):
            if not _column_ok(kind, column):
                i = next(i for i, v in enumerate(column) if not _column_ok(kind, (v,)))
                raise RecordDecodeError(
                    f"topic {name!r} partition {ids[i]}: PartitionRecord.{field}: got {column[i]!r}"
                )
    return TopicFrame(name, topic_id, ids, regs, hashlib.sha256(payload).digest())


_NONE = type(None)
# Field kinds checked a column at a time: kind -> allowed value types (for lists: of the list).
_COLUMN_TYPES: dict[Any, frozenset[type]] = {
    INT: frozenset({int}),
    STR: frozenset({str}),
    BOOL: frozenset({bool}),
    OPT_INT: frozenset({int, _NONE}),
    OPT_STR: frozenset({str, _NONE}),
    INTS: frozenset({tuple}),
    OPT_INTS: frozenset({tuple, _NONE}),
}
_INT_LISTS = (INTS, OPT_INTS)
_INT_ONLY = frozenset({int})


def _column_ok(kind: Any, column: Row) -> bool:
    """Whether every value of ``column`` passes ``kind`` unchanged (arrays unpack as tuples)."""
    allowed = _COLUMN_TYPES[kind]
    if not set(map(type, column)) <= allowed:
        return False
    if kind is INTS:
        return set(map(type, chain.from_iterable(column))) <= _INT_ONLY
    if kind is OPT_INTS:
        return set(map(type, chain.from_iterable(v for v in column if v is not None))) <= _INT_ONLY
    return True


def _decode_rows(chunk: Any, strict: bool = True) -> tuple[type[Record], tuple[Row, ...]]:
    """Check a row chunk (arrays unpacked as tuples): its type, version, field names, row widths
    and, when ``strict``, every value against the record class's field kinds."""
    if not isinstance(chunk, dict) or set(chunk) != {"type", "version", "fields", "rows"}:
        raise RecordDecodeError("not a record chunk map")
    type_id, version, names, rows = chunk["type"], chunk["version"], chunk["fields"], chunk["rows"]
    cls = RECORD_TYPES.get(type_id) if type(type_id) is int else None
    if cls is None:
        raise RecordDecodeError(f"unknown record type {type_id!r}")
    if version != cls.VERSION:
        raise RecordDecodeError(f"{cls.NAME}: unsupported version {version!r}")
    if names != tuple(n for n, _ in cls.FIELDS):
        raise RecordDecodeError(f"{cls.NAME}: fields {names!r} do not match the codec")
    if type(rows) is not tuple:
        raise RecordDecodeError("chunk rows must be a list")
    kinds = [k for _, k in cls.FIELDS]
    width = len(kinds)
    if set(map(type, rows)) - {tuple} or set(map(len, rows)) - {width}:
        bad = next(r for r in rows if type(r) is not tuple or len(r) != width)
        raise RecordDecodeError(f"{cls.NAME}: row {bad!r} does not have {width} values")
    if not strict or not rows or not kinds:
        return cls, rows
    if all(kind in _COLUMN_TYPES for kind in kinds):
        if all(_column_ok(kind, column) for kind, column in zip(kinds, zip(*rows))):
            return cls, rows
    else:  # kinds that normalise values (lists of maps): check and rebuild every row
        try:
            return cls, tuple(tuple(kind(v) for kind, v in zip(kinds, row)) for row in rows)
        except TypeError:
            pass
    for i, row in enumerate(rows):  # slow path, only to name the bad value
        for (name, kind), v in zip(cls.FIELDS, row):
            try:
                kind(v)
            except TypeError as e:
                raise RecordDecodeError(f"row {i}: {cls.NAME}.{name}: {e}, got {v!r}") from None
    raise RecordDecodeError(f"{cls.NAME}: a value does not check")  # not reached: a kind refused
