"""Snapshot files: round trip, naming, listing, retention and corruption detection."""

from __future__ import annotations

import logging
import os
from dataclasses import replace

import msgpack
import pytest

from kraft.log import (
    CorruptSnapshotError,
    SnapshotHeader,
    delete_snapshots_before,
    encode_frame,
    latest_snapshot,
    list_snapshots,
    parse_snapshot_name,
    read_snapshot,
    read_snapshot_header,
    snapshot_name,
    write_snapshot,
)
from kraft.log.segment import iter_frames
from kraft.log.snapshot import SNAPSHOT_FORMAT
from kraft.records import (
    ConfigRecord,
    FeatureLevelRecord,
    LeaderChangeRecord,
    NoOpRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    TopicRecord,
)

TID = "4c6b1f0e-2a0c-4d3e-9a3c-1f2e3d4c5b6a"


def sample_records(partitions=2500):
    recs = [
        FeatureLevelRecord("metadata.version", 7),
        RegisterBrokerRecord(
            1,
            "inc-1",
            10,
            ({"name": "PLAINTEXT", "host": "h", "port": 9092, "security_protocol": "PLAINTEXT"},),
            ({"name": "metadata.version", "min_version": 1, "max_version": 7},),
            None,
            False,
            False,
        ),
        RegisterBrokerRecord(2, "inc-2", 11, (), (), "rack-a", True, False),
        TopicRecord("orders", TID),
    ]
    recs += [PartitionRecord(i, TID, (1, 2), (1,), (), (), 1, 0, 3, 4) for i in range(partitions)]
    recs += [
        ConfigRecord(2, "orders", "retention.ms", "1000"),
        ConfigRecord(2, "orders", "x", None),
        ProducerIdsRecord(1, 10, 5000),
        NoOpRecord(),
        LeaderChangeRecord(3, 9),
    ]
    return recs


def header_for(records, end_offset=120, term=3, fmt=SNAPSHOT_FORMAT):
    return SnapshotHeader(
        end_offset=end_offset,
        term=term,
        raft_index=77,
        timestamp_ms=123456,
        last_hash=b"\xab" * 32,
        record_count=len(records),
        image_checksum="c0ffee",
        format=fmt,
    )


@pytest.mark.parametrize("strict", [True, False])
def test_round_trip(tmp_path, strict):
    recs = sample_records()
    header = header_for(recs)
    path = write_snapshot(tmp_path, header, iter(recs))  # any iterable
    assert path == tmp_path / "00000000000000000120-0000000003.checkpoint"
    assert not list(tmp_path.glob("*.part"))
    got_header, records = read_snapshot(path, strict=strict)
    assert got_header == header
    assert list(records) == recs
    assert read_snapshot_header(path) == header


def test_empty_snapshot(tmp_path):
    header = header_for([], end_offset=0, term=0)
    path = write_snapshot(tmp_path, header, [])
    h, records = read_snapshot(path)
    assert h == header and list(records) == []


def test_names():
    assert snapshot_name(57, 2) == "00000000000000000057-0000000002.checkpoint"
    assert parse_snapshot_name("/x/00000000000000000057-0000000002.checkpoint") == (57, 2)
    for bad in ("57-2.checkpoint", "00000000000000000057-0000000002.checkpoint.part", "x.log"):
        with pytest.raises(ValueError):
            parse_snapshot_name(bad)


def test_list_latest_and_part_cleanup(tmp_path, caplog):
    assert list_snapshots(tmp_path / "missing") == [] and latest_snapshot(tmp_path) is None
    recs = [NoOpRecord()]
    for end, term in ((300, 2), (20, 1), (1000, 4), (300, 3)):
        write_snapshot(tmp_path, header_for(recs, end, term), recs)
    leftover = tmp_path / (snapshot_name(2000, 5) + ".part")
    leftover.write_bytes(b"half a snapshot")
    deleted = tmp_path / (snapshot_name(10, 1) + ".deleted")
    deleted.write_bytes(b"")
    (tmp_path / "notes.txt").write_text("not a snapshot")
    with caplog.at_level(logging.WARNING, logger="kraft.log.snapshot"):
        snaps = list_snapshots(tmp_path)
    assert [parse_snapshot_name(p) for p in snaps] == [(20, 1), (300, 2), (300, 3), (1000, 4)]
    assert not leftover.exists() and not deleted.exists()
    assert any(str(leftover) in r.getMessage() for r in caplog.records)
    assert latest_snapshot(tmp_path) == tmp_path / snapshot_name(1000, 4)


def test_delete_snapshots_before(tmp_path):
    recs = [NoOpRecord()]
    for end in (10, 20, 30):
        write_snapshot(tmp_path, header_for(recs, end, 1), recs)
    gone = delete_snapshots_before(tmp_path, 30)
    assert [parse_snapshot_name(p)[0] for p in gone] == [10, 20]
    assert [parse_snapshot_name(p)[0] for p in list_snapshots(tmp_path)] == [30]
    assert not list(tmp_path.glob("*.deleted"))


def test_wrong_record_count_leaves_nothing(tmp_path):
    recs = sample_records(10)
    with pytest.raises(ValueError, match="records"):
        write_snapshot(tmp_path, replace(header_for(recs), record_count=3), recs)
    assert list(tmp_path.iterdir()) == []


def test_failing_record_source_leaves_nothing(tmp_path):
    def records():
        yield NoOpRecord()
        raise RuntimeError("image went away")

    with pytest.raises(RuntimeError):
        write_snapshot(tmp_path, header_for([1]), records())
    assert list(tmp_path.iterdir()) == []


def written(tmp_path, partitions=3000, fmt=SNAPSHOT_FORMAT):
    recs = sample_records(partitions)
    return write_snapshot(tmp_path, header_for(recs, fmt=fmt), recs), recs


def payloads(path):
    return [bytes(f.payload) for f in iter_frames(path.read_bytes())]


def test_flipped_byte_refused(tmp_path):
    path, _ = written(tmp_path)
    data = bytearray(path.read_bytes())
    pos = len(data) // 2
    data[pos] ^= 0x04
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptSnapshotError) as info:
        read_snapshot(path)
    assert info.value.path == path and "CRC" in info.value.reason
    assert info.value.position <= pos and str(path) in str(info.value)


def test_truncated_refused(tmp_path):
    path, _ = written(tmp_path)
    data = path.read_bytes()
    for cut in (len(data) - 5, len(data) // 2, 3, 0):
        path.write_bytes(data[:cut])
        with pytest.raises(CorruptSnapshotError):
            read_snapshot(path)


def test_missing_footer_refused(tmp_path):
    path, _ = written(tmp_path)
    frames = payloads(path)
    path.write_bytes(b"".join(encode_frame(p) for p in frames[:-1]))  # valid CRCs, no footer
    with pytest.raises(CorruptSnapshotError, match="footer"):
        read_snapshot(path)


def test_reframed_chunk_fails_checksum(tmp_path):
    path, _ = written(tmp_path)
    frames = payloads(path)
    chunk = msgpack.unpackb(frames[2], raw=False)
    chunk["rows"] = chunk["rows"][:-1]  # drop one record
    frames[2] = msgpack.packb(chunk, use_bin_type=True)
    path.write_bytes(b"".join(encode_frame(p) for p in frames))  # CRCs all valid
    with pytest.raises(CorruptSnapshotError, match="SHA-256"):
        read_snapshot(path)


def test_footer_count_mismatch_refused(tmp_path):
    path, _ = written(tmp_path)
    frames = payloads(path)
    footer = msgpack.unpackb(frames[-1], raw=False)
    footer["record_count"] += 1
    frames[-1] = msgpack.packb(footer, use_bin_type=True)
    path.write_bytes(b"".join(encode_frame(p) for p in frames))
    with pytest.raises(CorruptSnapshotError, match="count"):
        read_snapshot(path)


def test_renamed_snapshot_refused(tmp_path):
    path, _ = written(tmp_path)
    other = tmp_path / snapshot_name(999, 3)
    os.replace(path, other)
    with pytest.raises(CorruptSnapshotError, match="name"):
        read_snapshot(other)


def test_bad_record_in_chunk_refused(tmp_path):
    """A writer bug (valid checksum, bad field value) is still caught by strict decoding."""
    import hashlib

    path, _ = written(tmp_path, partitions=5, fmt=2)
    frames = payloads(path)
    for i, p in enumerate(frames[1:-1], 1):
        chunk = msgpack.unpackb(p, raw=False)
        if chunk["type"] == PartitionRecord.TYPE:
            chunk["rows"][0][2] = "not-a-list"
            frames[i] = msgpack.packb(chunk, use_bin_type=True)
    footer = msgpack.unpackb(frames[-1], raw=False)
    footer["sha256"] = hashlib.sha256(b"".join(frames[:-1])).digest()
    frames[-1] = msgpack.packb(footer, use_bin_type=True)
    path.write_bytes(b"".join(encode_frame(p) for p in frames))
    header, records = read_snapshot(path)
    with pytest.raises(CorruptSnapshotError, match="PartitionRecord"):
        list(records)


def test_chunks_hold_at_most_1000_records(tmp_path):
    path, recs = written(tmp_path, partitions=2500, fmt=2)
    chunks = [msgpack.unpackb(p, raw=False) for p in payloads(path)[1:-1]]
    assert all(len(c["rows"]) <= 1000 for c in chunks)
    assert sum(len(c["rows"]) for c in chunks) == len(recs)


def _rewrite_partition_rows(path, edit):
    """Apply ``edit(rows)`` to every PartitionRecord chunk and re-seal the file (footer SHA-256)."""
    import hashlib

    frames = payloads(path)
    for i, p in enumerate(frames[1:-1], 1):
        chunk = msgpack.unpackb(p, raw=False)
        if chunk["type"] == PartitionRecord.TYPE:
            edit(chunk["rows"])
            frames[i] = msgpack.packb(chunk, use_bin_type=True)
    footer = msgpack.unpackb(frames[-1], raw=False)
    footer["sha256"] = hashlib.sha256(b"".join(frames[:-1])).digest()
    frames[-1] = msgpack.packb(footer, use_bin_type=True)
    path.write_bytes(b"".join(encode_frame(p) for p in frames))


@pytest.mark.parametrize(
    "column, value, field",
    [
        (6, True, "leader"),  # a bool is not an integer
        (6, None, "leader"),
        (0, "7", "partition_id"),
        (1, 5, "topic_id"),
        (2, [1, "2"], "replicas"),  # a string inside a list of integers
        (3, [1, False], "isr"),
        (4, None, "removing_replicas"),  # not optional
        (9, 1.5, "partition_epoch"),
    ],
)
def test_ill_typed_partition_value_refused_naming_row_and_field(tmp_path, column, value, field):
    """The column-wise strict check refuses exactly what the per-value validators refuse, and
    names the chunk position, the row and the field, for records and for chunk readers alike."""
    from kraft.metadata.replay import image_from_records

    path, _ = written(tmp_path, partitions=1500, fmt=2)

    def edit(rows):
        if len(rows) > 300:
            rows[300][column] = value

    _rewrite_partition_rows(path, edit)
    with pytest.raises(
        CorruptSnapshotError,
        match=rf"at byte \d+: bad record chunk: row 300: PartitionRecord\.{field}",
    ):
        list(read_snapshot(path)[1])
    with pytest.raises(CorruptSnapshotError, match=rf"row 300: PartitionRecord\.{field}"):
        image_from_records(read_snapshot(path)[1], offset=0)


def test_short_partition_row_refused(tmp_path):
    path, _ = written(tmp_path, partitions=1500, fmt=2)
    _rewrite_partition_rows(path, lambda rows: rows[5].pop())
    with pytest.raises(CorruptSnapshotError, match="does not have 10 values"):
        list(read_snapshot(path)[1])


def test_chunks_and_records_agree(tmp_path):
    path, recs = written(tmp_path, partitions=2500)
    records = read_snapshot(path)[1]
    assert [cls(*row) for cls, rows in records.iter_chunks() for row in rows] == recs
    assert list(records) == recs


def test_format_1_snapshots_are_still_read(tmp_path):
    recs = sample_records(10)
    header = replace(header_for(recs), format=1)
    path = write_snapshot(tmp_path, header, recs)
    got, records = read_snapshot(path)
    assert got.format == got.checksum_version == 1
    assert list(records) == recs
    assert read_snapshot_header(path).checksum_version == 1
    assert header_for(recs).checksum_version == 2


def test_writing_runs_gives_the_same_bytes_as_writing_records(tmp_path):
    """``write_snapshot_runs(image.record_runs())`` == ``write_snapshot(image.iter_records())``,
    byte for byte: topics without partitions (adjacent TopicRecords), topics of more than
    CHUNK_RECORDS partitions, brokers, configs."""
    from kraft.log.snapshot import write_snapshot_runs
    from kraft.metadata.replay import image_from_records

    recs = sample_records(2500)
    recs[4:4] = [TopicRecord("empty-a", "t-a"), TopicRecord("empty-b", "t-b")]
    recs += [
        TopicRecord("small", "t-s"),
        *(PartitionRecord(i, "t-s", (2,), (2,), (), (), 2, 0, 0, 0) for i in range(3)),
    ]
    image = image_from_records(recs, offset=200)
    header = header_for(list(image.iter_records()))
    a = write_snapshot(tmp_path / "a", header, image.iter_records()).read_bytes()
    b = write_snapshot_runs(tmp_path / "b", header, image.record_runs()).read_bytes()
    assert a == b


# ---- the broker's load: partition values proven by the image checksum ------------------------


def _broker_snapshot(tmp_path, partitions=1500, fmt=SNAPSHOT_FORMAT):
    """A snapshot as a broker checkpoint writes it (real image checksum in the header), in
    snapshot format ``fmt``."""
    from broker.metadata.checkpoint import write_checkpoint
    from kraft.log.snapshot import write_snapshot_runs
    from kraft.metadata.replay import image_from_records
    from kraft.snapshot_image import image_header

    recs = sample_records(partitions)
    image = image_from_records(recs, offset=len(recs) - 1, term=3)
    if fmt == SNAPSHOT_FORMAT:
        return write_checkpoint(tmp_path, image)[0], image
    header = image_header(image, fmt=fmt)
    return write_snapshot_runs(tmp_path, header, image.record_runs()), image


def test_broker_load_equals_the_strict_load(tmp_path):
    from broker.metadata.checkpoint import image_from_snapshot
    from kraft.metadata.replay import image_from_records

    path, image = _broker_snapshot(tmp_path)
    header, records = read_snapshot(path)
    strict = image_from_records(
        records,
        offset=header.end_offset - 1,
        term=header.term,
        raft_index=header.raft_index,
        timestamp_ms=header.timestamp_ms,
        last_hash=header.last_hash,
    )
    loaded = image_from_snapshot(path)
    assert loaded == strict == image and loaded.checksum() == image.checksum()
    unchecked = read_snapshot(path, unchecked_partitions=True)[1]
    assert [r for r in unchecked] == [r for r in read_snapshot(path)[1]]


@pytest.mark.parametrize(
    "column, value, field",
    [
        (6, True, "leader"),
        (6, None, "leader"),
        (0, "7", "partition_id"),
        (0, 1.0, "partition_id"),
        (1, 5, "topic_id"),
        (2, [1, "2"], "replicas"),
        (3, [1, False], "isr"),
        (4, None, "removing_replicas"),
        (9, 1.5, "partition_epoch"),
        (8, b"\x01", "leader_epoch"),
    ],
)
def test_broker_load_refuses_what_strict_decoding_refuses(tmp_path, column, value, field):
    """A writer bug (valid file checksum, a badly typed partition value): the broker's load skips
    the per-value checks, but the image checksum catches the value and the strict re-read names
    it, as the strict reader does."""
    from broker.metadata.checkpoint import image_from_snapshot

    path, _ = _broker_snapshot(tmp_path, fmt=2)

    def edit(rows):
        if len(rows) > 300:
            rows[300][column] = value

    _rewrite_partition_rows(path, edit)
    with pytest.raises(CorruptSnapshotError, match=rf"row 300: PartitionRecord\.{field}"):
        image_from_snapshot(path)


def test_broker_load_refuses_a_well_typed_wrong_value(tmp_path):
    from broker.metadata.checkpoint import image_from_snapshot

    path, _ = _broker_snapshot(tmp_path, fmt=2)

    def edit(rows):
        if len(rows) > 300:
            rows[300][8] += 1  # a leader epoch the image checksum does not cover

    _rewrite_partition_rows(path, edit)
    with pytest.raises(CorruptSnapshotError, match="image checksum does not match"):
        image_from_snapshot(path)


def test_broker_checkpoints_are_written_one_at_a_time(tmp_path):
    """A shutdown's checkpoint_now while the loader's own checkpoint is being written: both
    would write the same ``.part`` file; they take turns, and one checkpoint results."""
    import trio

    from broker.metadata.metadata_loader import MetadataLoader

    _, image = _broker_snapshot(tmp_path / "src", partitions=5000)
    loader = MetadataLoader(None, [], tmp_path / "meta")
    loader.image = image

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(loader.checkpoint_now)

    trio.run(main)
    assert [p.name for p in list_snapshots(tmp_path / "meta")] == [
        snapshot_name(image.offset + 1, image.term)
    ]


# ---- format 3: topic frames ---------------------------------------------------------------------


def _rewrite_topic_frames(path, edit, extra=()):
    """Apply ``edit(ids, regs)`` (lists, regs as lists of 8 values) to every topic frame, append
    ``extra`` payloads before the footer, and re-seal the file (counts, footer SHA-256)."""
    import hashlib

    frames = payloads(path)
    for i, p in enumerate(frames[1:-1], 1):
        if p[:1] == b"\x94":
            name, tid, ids, regs = msgpack.unpackb(p, raw=False)
            edit(ids, regs)
            frames[i] = msgpack.packb([name, tid, ids, regs], use_bin_type=True)
    frames[-1:-1] = list(extra)
    added = sum(len(msgpack.unpackb(p, raw=False)["rows"]) for p in extra)
    header = msgpack.unpackb(frames[0], raw=False)
    header["record_count"] += added
    frames[0] = msgpack.packb(header, use_bin_type=True)
    footer = msgpack.unpackb(frames[-1], raw=False)
    footer["record_count"] += added
    footer["sha256"] = hashlib.sha256(b"".join(frames[:-1])).digest()
    frames[-1] = msgpack.packb(footer, use_bin_type=True)
    path.write_bytes(b"".join(encode_frame(p) for p in frames))


def test_a_topic_frame_is_the_topics_digest_preimage(tmp_path):
    """Format 3 writes a topic and its partitions as one frame whose SHA-256 is the topic's
    checksum digest, ``iter_chunks`` still hands out the same rows, and the image loads equal."""
    import hashlib

    from broker.metadata.checkpoint import image_from_snapshot

    path, image = _broker_snapshot(tmp_path, partitions=2500)
    topic_frames = [p for p in payloads(path)[1:-1] if p[:1] == b"\x94"]
    assert [hashlib.sha256(p).digest() for p in topic_frames] == [
        image.topic(name).digest() for name in image.topic_names()
    ]
    records = read_snapshot(path)[1]
    assert [cls(*row) for cls, rows in records.iter_chunks() for row in rows] == list(
        image.iter_records()
    )
    loaded = image_from_snapshot(path)
    assert loaded == image and loaded.checksum() == image.checksum()


@pytest.mark.parametrize("fmt", [2, 3])
def test_both_formats_load_to_the_same_image(tmp_path, fmt):
    from broker.metadata.checkpoint import image_from_snapshot

    path, image = _broker_snapshot(tmp_path, fmt=fmt)
    assert read_snapshot_header(path).format == fmt
    assert read_snapshot_header(path).checksum_version == 2
    loaded = image_from_snapshot(path)
    assert loaded == image and loaded.checksum() == image.checksum()


@pytest.mark.parametrize(
    "where, value, field",
    [
        ("leader", True, "leader"),
        ("leader", None, "leader"),
        ("id", "7", "partition_id"),
        ("replicas", [1, "2"], "replicas"),
        ("isr", [1, False], "isr"),
        ("removing", None, "removing_replicas"),
        ("epoch", 1.5, "partition_epoch"),
    ],
)
def test_ill_typed_value_in_a_topic_frame_refused(tmp_path, where, value, field):
    """Strict reading names the topic, partition and field; the broker's load (values unchecked,
    the image checksum compared) refuses it too, naming it through the strict re-read."""
    from broker.metadata.checkpoint import image_from_snapshot

    path, _ = _broker_snapshot(tmp_path)
    column = {"leader": 4, "replicas": 0, "isr": 1, "removing": 2, "epoch": 7}

    def edit(ids, regs):
        if where == "id":
            ids[300] = value
        else:
            regs[300][column[where]] = value

    _rewrite_topic_frames(path, edit)
    with pytest.raises(CorruptSnapshotError, match=rf"bad topic frame: .*PartitionRecord\.{field}"):
        list(read_snapshot(path)[1])
    with pytest.raises(CorruptSnapshotError, match=rf"PartitionRecord\.{field}"):
        image_from_snapshot(path)


def test_a_short_registration_in_a_topic_frame_refused(tmp_path):
    path, _ = _broker_snapshot(tmp_path)
    from broker.metadata.checkpoint import image_from_snapshot

    _rewrite_topic_frames(path, lambda ids, regs: regs[5].pop())
    for strict in (True, False):
        with pytest.raises(CorruptSnapshotError, match="does not have 8 values"):
            list(read_snapshot(path, strict=strict)[1])
    with pytest.raises(CorruptSnapshotError, match="does not have 8 values"):
        image_from_snapshot(path)  # unchecked, then the checksum fails and strict names it


def test_a_well_typed_wrong_value_in_a_topic_frame_refused(tmp_path):
    """A resealed snapshot whose topic frame holds another leader epoch: the frame's hash is no
    longer the digest the header's image checksum holds."""
    from broker.metadata.checkpoint import image_from_snapshot

    path, _ = _broker_snapshot(tmp_path)

    def edit(ids, regs):
        regs[300][6] += 1

    _rewrite_topic_frames(path, edit)
    with pytest.raises(CorruptSnapshotError, match="image checksum does not match"):
        image_from_snapshot(path)


def test_records_after_a_topic_frame_cannot_borrow_its_digest(tmp_path):
    """A resealed snapshot with a PartitionRecord chunk added after the topic frames (changing a
    partition the frame holds): the frames' hashes still match the header's digests, but they
    no longer describe the topic, so the load takes no digest from them and refuses the file."""
    from broker.metadata.checkpoint import image_from_snapshot

    path, image = _broker_snapshot(tmp_path)
    tid = image.topics_by_name["orders"]
    row = [7, tid, [2, 1], [2], [], [], 2, 0, 3, 4]
    chunk = {
        "type": PartitionRecord.TYPE,
        "version": PartitionRecord.VERSION,
        "fields": [n for n, _ in PartitionRecord.FIELDS],
        "rows": [row],
    }
    _rewrite_topic_frames(path, lambda ids, regs: None, [msgpack.packb(chunk, use_bin_type=True)])
    header, records = read_snapshot(path)
    assert sum(len(rows) for _, rows in records.iter_chunks()) == header.record_count
    with pytest.raises(CorruptSnapshotError, match="image checksum does not match"):
        image_from_snapshot(path)


def test_topic_frames_are_refused_in_a_format_2_file(tmp_path):
    path, _ = written(tmp_path, partitions=5, fmt=3)
    frames = payloads(path)
    header = msgpack.unpackb(frames[0], raw=False)
    header["format"] = 2
    frames[0] = msgpack.packb(header, use_bin_type=True)
    import hashlib

    footer = msgpack.unpackb(frames[-1], raw=False)
    footer["sha256"] = hashlib.sha256(b"".join(frames[:-1])).digest()
    frames[-1] = msgpack.packb(footer, use_bin_type=True)
    path.write_bytes(b"".join(encode_frame(p) for p in frames))
    with pytest.raises(CorruptSnapshotError, match="not a record chunk map"):
        list(read_snapshot(path)[1])


def test_topic_frames_load_directly_or_through_the_delta_alike(tmp_path):
    """A format-3 file whose topic frames are followed only by records that cannot touch a topic
    builds its topics directly; one holding other records after them (here a PartitionRecord
    run the writer could not put in a frame: ids not ascending) replays the frames into the
    delta in file order. Either way the image is that of replaying the records."""
    from kraft.metadata.replay import image_from_records

    recs = [r for r in sample_records(30) if type(r) is not NoOpRecord]
    direct = write_snapshot(tmp_path / "direct", header_for(recs), recs)
    image = image_from_records(read_snapshot(direct)[1], offset=9, adopt_digests=True)
    assert image == image_from_records(recs, offset=9)
    assert image.topics_by_id[TID]._digest is not None  # built directly, digest adopted
    mixed = [*recs[:4], *reversed(recs[4:34]), *recs[34:]]
    path = write_snapshot(tmp_path / "mixed", header_for(mixed), mixed)
    frames = [p for p in payloads(path)[1:-1] if p[:1] == b"\x94"]
    assert [msgpack.unpackb(p)[2] for p in frames] == [[]]  # the topic, without partitions
    image = image_from_records(read_snapshot(path)[1], offset=9, adopt_digests=True)
    assert image == image_from_records(mixed, offset=9)
    assert image.topics_by_id[TID]._digest is None  # through the delta: nothing adopted


@pytest.mark.parametrize("same", ["name", "id"])
def test_two_topic_frames_of_one_topic_refused(tmp_path, same):
    from kraft.metadata.delta import ReplayError
    from kraft.metadata.replay import image_from_records
    from kraft.snapshotter import snapshot_state

    second = TopicRecord("orders", "t-2") if same == "name" else TopicRecord("other", TID)
    recs = [*sample_records(5), second]
    path = write_snapshot(tmp_path, header_for(recs), recs)
    with pytest.raises(ReplayError, match=f"topic {same}.*already exists"):
        image_from_records(read_snapshot(path)[1], offset=9)
    with pytest.raises(ReplayError, match=f"topic {same}.*already exists"):
        image_from_records(recs, offset=9)
    with pytest.raises(CorruptSnapshotError, match="records do not replay"):
        snapshot_state(path)
