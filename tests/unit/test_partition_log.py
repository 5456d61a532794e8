"""Partition log: append raw Kafka batches, read back, roll, truncate, recover, checkpoints."""

from __future__ import annotations

import datetime
import io
import logging

import pytest
from kio.records.readers import read_batch
from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_new_batch
from kio.static.primitive import i8, i16, i32, i64

from broker.replica.partition_log import (
    HW_FILE,
    LEADER_EPOCH_FILE,
    RECOVERY_POINT_FILE,
    CorruptRecordError,
    InvalidBatchError,
    PartitionLog,
    parse_batches,
)


def make_batch(values: list[bytes]) -> bytes:
    """A client-style magic-2 batch (base offset 0) holding ``values``."""
    now = datetime.datetime.now(datetime.UTC)
    records = tuple(
        Record(attributes=i8(0), timestamp=now, offset=i64(i), key=None, value=v, headers=())
        for i, v in enumerate(values)
    )
    buf = io.BytesIO()
    write_new_batch(
        buf,
        NewRecordBatch(
            producer_id=i64(-1),
            producer_epoch=i16(-1),
            base_sequence=i32(-1),
            records=records,
            attributes=i16(0),
        ),
    )
    return buf.getvalue()


def values_in(data: bytes) -> list[tuple[int, bytes]]:
    out = []
    pos = 0
    while pos < len(data):
        batch, size = read_batch(memoryview(data), pos)
        out += [(r.offset, r.value) for r in batch.records]
        pos += size
    return out


def test_append_assigns_offsets_and_reads_back(tmp_path):
    plog = PartitionLog.open(tmp_path / "t-0")
    assert plog.log_end_offset == 0
    assert plog.append(make_batch([b"a", b"b"]), leader_epoch=3) == (0, 1)
    assert plog.append(make_batch([b"c"]), leader_epoch=3) == (2, 2)
    assert plog.log_end_offset == 3
    assert values_in(plog.read(0)) == [(0, b"a"), (1, b"b"), (2, b"c")]
    assert values_in(plog.read(2)) == [(2, b"c")]
    assert values_in(plog.read(1)) == [(0, b"a"), (1, b"b"), (2, b"c")]  # whole containing batch
    assert plog.read(3) == b""
    with pytest.raises(ValueError):
        plog.read(4)
    assert plog.epochs == [(3, 0)]
    plog.close()


def test_rejects_garbage(tmp_path):
    plog = PartitionLog.open(tmp_path / "t-0")
    with pytest.raises(InvalidBatchError):
        plog.append(b"\x00" * 100)
    good = make_batch([b"x"])
    with pytest.raises(InvalidBatchError):
        plog.append(good + b"\x01\x02")
    assert plog.log_end_offset == 0


def test_rolls_segments_and_reopens(tmp_path):
    plog = PartitionLog.open(tmp_path / "t-0", segment_bytes=200)
    for i in range(10):
        plog.append(make_batch([b"v%d" % i] * 3), leader_epoch=1)
    assert len(plog.segment_files()) > 1
    plog.close()
    again = PartitionLog.open(tmp_path / "t-0", segment_bytes=200)
    assert again.log_end_offset == 30
    got = []
    off = 0
    while off < again.log_end_offset:
        chunk = values_in(again.read(off, max_bytes=1))
        got += chunk
        off = chunk[-1][0] + 1
    assert [o for o, _ in got] == list(range(30))
    assert again.read(17, max_bytes=1 << 20)  # read across segments
    again.close()


def test_torn_tail_is_truncated_on_open(tmp_path, caplog):
    plog = PartitionLog.open(tmp_path / "t-0")
    plog.append(make_batch([b"a"]))
    plog.append(make_batch([b"b", b"c"]))
    seg = plog.segment_files()[-1]
    plog.close()
    data = seg.read_bytes()
    seg.write_bytes(data[:-5])  # torn write of the second batch
    with caplog.at_level(logging.WARNING):
        again = PartitionLog.open(tmp_path / "t-0")
    assert "torn" in caplog.text and str(seg) in caplog.text
    assert again.log_end_offset == 1
    assert again.append(make_batch([b"d"])) == (1, 1)
    again.close()


def _flip_second_batch(tmp_path):
    plog = PartitionLog.open(tmp_path / "t-0")
    for v in (b"a", b"b", b"c"):
        plog.append(make_batch([v]))
    seg = plog.segment_files()[-1]
    infos, _ = parse_batches(seg.read_bytes())
    plog.close()
    raw = bytearray(seg.read_bytes())
    raw[infos[1].position + infos[1].size - 1] ^= 0xFF  # flip a byte of batch 2's payload
    seg.write_bytes(bytes(raw))
    return seg, infos[1].position


def test_corrupt_crc_without_a_recovery_point_truncates_from_bad_batch(tmp_path):
    """Segments not wholly below the recovery point (here: none is, the checkpoint is gone, as
    after a crash before any flush) are scanned at open, Kafka's log recovery."""
    _flip_second_batch(tmp_path)
    (tmp_path / "t-0" / RECOVERY_POINT_FILE).unlink()
    again = PartitionLog.open(tmp_path / "t-0")
    assert again.opened == (0, 1)
    assert again.log_end_offset == 1
    again.close()


def test_corrupt_crc_below_the_recovery_point_is_refused_when_read(tmp_path, caplog):
    """After a clean close nothing is scanned at open (as Kafka); a damaged batch is found
    when read: CorruptRecordError naming file and byte, never its bytes."""
    seg, position = _flip_second_batch(tmp_path)
    again = PartitionLog.open(tmp_path / "t-0")
    assert again.opened == (1, 0)
    assert again.log_end_offset == 3
    assert values_in(again.read(0, max_bytes=1)) == [(0, b"a")]
    with caplog.at_level(logging.ERROR), pytest.raises(CorruptRecordError) as info:
        again.read(1)
    assert f"{seg}: batch at byte {position} (offsets 1-1) is corrupt: CRC mismatch" in str(
        info.value
    )
    assert str(info.value) in caplog.text
    with pytest.raises(CorruptRecordError):
        again.read(0)  # a read that would take the bad batch along
    assert values_in(again.read(2)) == [(2, b"c")]
    again.close()


def test_truncate_to(tmp_path):
    plog = PartitionLog.open(tmp_path / "t-0", segment_bytes=150)
    for i in range(6):
        plog.append(make_batch([b"x", b"y"]), leader_epoch=i)
    plog.set_high_watermark(12)
    plog.truncate_to(5)  # offset 5 is inside batch [4, 5]: that whole batch goes
    assert plog.log_end_offset == 4
    assert plog.high_watermark == 4
    assert plog.epochs == [(0, 0), (1, 2)]
    assert values_in(plog.read(2))[-1][0] == 3  # a read returns batches of one segment
    plog.truncate_to(0)
    assert plog.log_end_offset == 0
    assert plog.append(make_batch([b"z"])) == (0, 0)
    plog.close()


def test_checkpoints_survive_restart(tmp_path):
    plog = PartitionLog.open(tmp_path / "t-0")
    plog.append(make_batch([b"a"] * 5), leader_epoch=2)
    plog.assign_epoch(4, 5)
    plog.append(make_batch([b"b"]), leader_epoch=4)
    plog.set_high_watermark(6)
    plog.close()
    assert (tmp_path / "t-0" / LEADER_EPOCH_FILE).read_text() == "0\n2\n2 0\n4 5\n"
    assert (tmp_path / "t-0" / HW_FILE).read_text() == "0\n1\n6\n"
    again = PartitionLog.open(tmp_path / "t-0")
    assert again.epochs == [(2, 0), (4, 5)]
    assert again.high_watermark == 6
    again.close()


def test_hw_beyond_log_end_is_clamped(tmp_path):
    d = tmp_path / "t-0"
    d.mkdir()
    (d / HW_FILE).write_text("0\n1\n99\n")
    plog = PartitionLog.open(d)
    assert plog.high_watermark == 0
