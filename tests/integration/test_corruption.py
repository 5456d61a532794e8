"""Corruption matrix for everything pykraft keeps on disk.

Metadata log segments, controller snapshots, broker metadata checkpoints and partition logs are
damaged in every way we can think of. The rule: a torn tail (a partial last write, zero-filled or
not) is truncated with a WARNING naming the file and byte; anything else in the metadata log or a
snapshot is refused with an error naming the file, the byte position and the offset, and the
files are left exactly as they were. Broker-side copies (metadata checkpoints, partition logs) are
caches of replicated data: they are discarded or truncated with a WARNING naming the file, as
Kafka does, and refetched.
"""

from __future__ import annotations

import logging
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from harness import ENV, REPO
from test_fuzz_kafka_listener import record_batch

from broker.metadata.checkpoint import load_checkpoint, write_checkpoint
from broker.replica.partition_log import (
    HW_FILE,
    LEADER_EPOCH_FILE,
    RECOVERY_POINT_FILE,
    CorruptRecordError,
    PartitionLog,
)
from kraft.log import (
    CorruptLogError,
    CorruptSnapshotError,
    MetadataLog,
    read_snapshot,
    segment_name,
)
from kraft.log.segment import HEADER_SIZE, iter_frames
from kraft.metadata.replay import image_from_records
from kraft.records import (
    ZERO_HASH,
    Batch,
    Provenance,
    RegisterBrokerRecord,
    TopicRecord,
    batch_hash,
)
from kraft.snapshotter import Snapshotter
from kraft.storage import meta_properties

SEGMENT_BYTES = 600  # a handful of batches per segment


def make_batches(count: int) -> list[tuple[Batch, bytes]]:
    out, prev = [], ZERO_HASH
    for i in range(count):
        recs = (TopicRecord(f"topic-{i}", f"00000000-0000-4000-8000-{i:012d}"),)
        b = Batch(i, 1, 10 + i, 1_000 + i, Provenance("User:test"), prev, recs)
        enc = b.encode()
        out.append((b, enc))
        prev = batch_hash(enc)
    return out


@pytest.fixture()
def log_dir(tmp_path: Path) -> Path:
    d = tmp_path / "log"
    with MetadataLog.open(d, segment_bytes=SEGMENT_BYTES, fsync="never") as mlog:
        for b, enc in make_batches(24):
            mlog.append_encoded(enc, b)
        assert len(mlog.segments) >= 4
    return d


def segments(d: Path) -> list[Path]:
    return sorted(d.glob("*.log"))


def snapshot_of_files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def frames_of(path: Path) -> list[tuple[int, int]]:
    """(position, end) of every frame in a segment."""
    return [(f.position, f.end) for f in iter_frames(path.read_bytes())]


def assert_refused(d: Path, path: Path, position: int | None = None) -> CorruptLogError:
    before = snapshot_of_files(d)
    with pytest.raises(CorruptLogError) as info:
        MetadataLog.open(d, segment_bytes=SEGMENT_BYTES, fsync="never")
    err = info.value
    message = str(err)
    assert str(path) in message and "at byte" in message and "offset" in message, message
    if position is not None:
        assert err.position == position, message
    assert snapshot_of_files(d) == before, "a refused log must be left untouched"
    return err


def assert_truncated(
    d: Path, caplog: pytest.LogCaptureFixture, path: Path, keep_next_offset: int
) -> None:
    with caplog.at_level(logging.WARNING, logger="kraft.log.metadata_log"):
        with MetadataLog.open(d, segment_bytes=SEGMENT_BYTES, fsync="never") as mlog:
            assert mlog.next_offset == keep_next_offset
            assert [b.base_offset for b in mlog.read_batches(0)] == list(range(keep_next_offset))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(path) in w or path.name in w for w in warnings), warnings


# ---- metadata log: torn tails are truncated ------------------------------------------------


def test_torn_tail_anywhere_in_the_last_frame(
    log_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    last = segments(log_dir)[-1]
    original = last.read_bytes()
    pos, end = frames_of(last)[-1]
    for cut in [*range(pos + 1, pos + HEADER_SIZE + 2), *range(pos + HEADER_SIZE + 2, end, 5)]:
        last.write_bytes(original[:cut])
        assert_truncated(log_dir, caplog, last, keep_next_offset=23)
        caplog.clear()


@pytest.mark.parametrize("tail", [b"\x00" * 7, b"\x00" * 8, b"\x00" * 100, b"\x00" * 4096])
def test_zero_filled_tail_is_truncated(
    log_dir: Path, caplog: pytest.LogCaptureFixture, tail: bytes
) -> None:
    """A crash after the file grew but before the data reached the disk leaves zeros."""
    last = segments(log_dir)[-1]
    last.write_bytes(last.read_bytes() + tail)
    assert_truncated(log_dir, caplog, last, keep_next_offset=24)


def test_zero_filled_last_frame_is_truncated(
    log_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    last = segments(log_dir)[-1]
    data = bytearray(last.read_bytes())
    pos, end = frames_of(last)[-1]
    data[pos:end] = bytes(end - pos)
    last.write_bytes(bytes(data))
    assert_truncated(log_dir, caplog, last, keep_next_offset=23)


@pytest.mark.parametrize("seed", range(8))
def test_garbage_appended_is_truncated_or_refused_never_accepted(
    log_dir: Path, caplog: pytest.LogCaptureFixture, seed: int
) -> None:
    last = segments(log_dir)[-1]
    last.write_bytes(
        last.read_bytes() + random.Random(seed).randbytes(random.Random(seed).randint(1, 300))
    )
    try:
        assert_truncated(log_dir, caplog, last, keep_next_offset=24)
    except CorruptLogError as err:
        assert str(last) in str(err) and "offset 24" in str(err)


# ---- metadata log: anything else is refused, naming file, byte and offset --------------------

FIELDS = {"length": range(4), "crc": range(4, 8), "payload": None}


@pytest.mark.parametrize("field", list(FIELDS))
@pytest.mark.parametrize("where", ["first segment", "middle of the last segment"])
def test_every_frame_field_corrupted_inside_the_log_is_refused(
    log_dir: Path, field: str, where: str
) -> None:
    segs = segments(log_dir)
    path = segs[0] if where == "first segment" else segs[-1]
    frames = frames_of(path)
    pos, end = frames[0] if where == "first segment" else frames[len(frames) // 2]
    original = path.read_bytes()
    offsets = FIELDS[field] or range(HEADER_SIZE, end - pos, 9)  # every 9th payload byte
    for i in offsets:
        for flip in (0x01, 0x80, 0xFF) if field != "payload" else (0x41,):
            data = bytearray(original)
            data[pos + i] ^= flip
            path.write_bytes(bytes(data))
            err = assert_refused(log_dir, path)
            assert err.position >= pos and err.offset is not None
    path.write_bytes(original)


def test_frame_with_a_valid_crc_but_wrong_batch_is_refused(log_dir: Path) -> None:
    """Re-framing another batch (CRC fine) in the middle breaks the offset/hash chain."""
    from kraft.log import encode_frame

    path = segments(log_dir)[0]
    (pos, end), (pos2, end2) = frames_of(path)[:2]
    data = path.read_bytes()
    swapped = data[:pos] + data[pos2:end2] + data[end:]
    path.write_bytes(swapped)
    assert_refused(log_dir, path, position=0)
    foreign = make_batches(1)[0][1]
    path.write_bytes(data[:pos2] + encode_frame(foreign) + data[end2:])
    assert_refused(log_dir, path, position=pos2)


def test_deleted_middle_segment_is_refused(log_dir: Path) -> None:
    segs = segments(log_dir)
    segs[1].unlink()
    err = assert_refused(log_dir, segs[2], position=0)
    assert "named for offset" in str(err)


def test_out_of_order_segment_name_is_refused(log_dir: Path) -> None:
    segs = segments(log_dir)
    base = int(segs[2].stem)
    wrong = segs[2].with_name(segment_name(base + 1))
    segs[2].rename(wrong)
    err = assert_refused(log_dir, wrong, position=0)
    assert f"log continues at {base}" in str(err)


def test_swapped_segment_names_are_refused(log_dir: Path) -> None:
    segs = segments(log_dir)
    tmp = segs[1].with_name("swap")
    segs[1].rename(tmp)
    segs[2].rename(segs[1])
    tmp.rename(segs[2])
    assert_refused(log_dir, segs[1])


def test_torn_tail_of_an_earlier_segment_is_refused(log_dir: Path) -> None:
    path = segments(log_dir)[1]
    path.write_bytes(path.read_bytes()[:-3])
    assert_refused(log_dir, path)


def test_controller_refuses_to_start_on_a_corrupt_log(tmp_path: Path, log_dir: Path) -> None:
    """The node's start-up says which file, byte and offset, and exits without touching it."""
    from kraft.config import write_properties

    meta = tmp_path / "meta"
    (meta / "raft").mkdir(parents=True)
    log_dir.rename(meta / "log")
    path = segments(meta / "log")[1]
    data = bytearray(path.read_bytes())
    data[HEADER_SIZE + 3] ^= 0xFF
    path.write_bytes(bytes(data))
    config = tmp_path / "controller.properties"
    secret = tmp_path / "raft.secret"
    secret.write_text("corruption-test-raft-secret-of-32b\n")
    secret.chmod(0o600)
    write_properties(
        config,
        {
            "controller.raft.secret.file": secret,
            "node.id": 1,
            "process.roles": "controller",
            "cluster.id": "c",
            "controller.quorum.voters": "1@127.0.0.1:1",
            "controller.quorum.raft.voters": "1@127.0.0.1:2",
            "metadata.log.dir": meta,
        },
    )
    meta_properties.write(
        meta, meta_properties.MetaProperties("c", 1, meta_properties.random_uuid())
    )
    before = snapshot_of_files(meta / "log")
    proc = subprocess.run(
        [sys.executable, "-m", "tools.cli", "controller", "--config", str(config)],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert f"refusing to start: corrupt metadata log {path} at byte 0 (offset" in proc.stderr
    assert f"kraft storage recover --config {config} --from-peers" in proc.stderr
    assert snapshot_of_files(meta / "log") == before


# ---- snapshots -----------------------------------------------------------------------------


def _image(brokers: int = 3, topics: int = 40):
    recs = [
        RegisterBrokerRecord(b, f"inc-{b}", 1, (), (), None, False, False)
        for b in range(1, brokers + 1)
    ]
    recs += [TopicRecord(f"t{i}", f"00000000-0000-4000-8000-{i:012d}") for i in range(topics)]
    return image_from_records(recs, offset=len(recs) - 1, term=2)


@pytest.fixture()
def snapshot_file(tmp_path: Path) -> Path:
    d = tmp_path / "snap"
    d.mkdir()
    return write_checkpoint(d, _image())[0]


def test_snapshot_corrupted_anywhere_is_refused(snapshot_file: Path) -> None:
    original = snapshot_file.read_bytes()
    frames = [(f.position, f.end) for f in iter_frames(original)]
    header, footer = frames[0], frames[-1]
    targets = {
        "header length": header[0],
        "header crc": header[0] + 5,
        "header payload": header[0] + 12,
        "chunk crc": frames[1][0] + 4,
        "chunk payload": frames[1][0] + 20,
        "footer crc": footer[0] + 6,
        "footer checksum": footer[1] - 3,
    }
    for name, i in targets.items():
        data = bytearray(original)
        data[i] ^= 0x40
        snapshot_file.write_bytes(bytes(data))
        with pytest.raises(CorruptSnapshotError) as info:
            _, records = read_snapshot(snapshot_file)
            list(records)
        assert str(snapshot_file) in str(info.value) and "at byte" in str(info.value), name
    for cut in (1, 7, header[1], frames[1][1] - 1, footer[0], len(original) - 1):
        snapshot_file.write_bytes(original[:cut])
        with pytest.raises(CorruptSnapshotError, match="at byte"):
            _, records = read_snapshot(snapshot_file)
            list(records)
    snapshot_file.write_bytes(original + b"garbage")
    with pytest.raises(CorruptSnapshotError):
        _, records = read_snapshot(snapshot_file)
        list(records)


def test_controller_refuses_a_corrupt_snapshot_it_needs(tmp_path: Path) -> None:
    """A log that starts after a snapshot cannot be used without that snapshot."""
    d = tmp_path / "log"
    with MetadataLog.open(d, segment_bytes=SEGMENT_BYTES, fsync="never") as mlog:
        snapper = Snapshotter(d, mlog, 1, 0)
        for b, enc in make_batches(24):
            mlog.append_encoded(enc, b)
        from kraft.metadata.image import MetadataImage
        from kraft.metadata.replay import replay

        image = replay(MetadataImage.EMPTY, mlog.read_batches(0))
        path = snapper.write(image)
        mlog.truncate_before(20)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with MetadataLog.open(d, segment_bytes=SEGMENT_BYTES, fsync="never") as mlog:
        assert mlog.start_offset > 0
        with pytest.raises(CorruptSnapshotError) as info:
            Snapshotter(d, mlog, 1, 0).load_image()
    assert str(path) in str(info.value)


# ---- broker metadata checkpoints -------------------------------------------------------------


def test_corrupt_broker_checkpoint_is_discarded_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "metadata"
    d.mkdir()
    older = write_checkpoint(d, _image(topics=10))[0]
    newer = write_checkpoint(d, _image(topics=20))[0]
    data = bytearray(newer.read_bytes())
    data[len(data) // 2] ^= 0x10
    newer.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="broker.metadata.checkpoint"):
        image = load_checkpoint(d)
    assert len(image.topics_by_name) == 10 and older.exists()
    assert any(str(newer) in r.getMessage() for r in caplog.records), caplog.text
    assert (d / (newer.name + ".corrupt")).exists()
    older.write_bytes(older.read_bytes()[:-5])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="broker.metadata.checkpoint"):
        assert load_checkpoint(d).offset == -1  # nothing usable: refetch from the controllers
    assert any(str(older) in r.getMessage() for r in caplog.records)


# ---- partition logs ------------------------------------------------------------------------


@pytest.fixture()
def partition_dir(tmp_path: Path) -> Path:
    d = tmp_path / "orders-0"
    plog = PartitionLog.open(d, segment_bytes=400, fsync=False)
    for i in range(12):
        plog.append(record_batch([f"value-{i}".encode()]), leader_epoch=1 + i // 6)
    plog.set_high_watermark(12)
    plog.close()
    assert len(list(d.glob("*.log"))) >= 3
    return d


def _reopen(d: Path) -> PartitionLog:
    return PartitionLog.open(d, segment_bytes=400, fsync=False)


@pytest.mark.parametrize("damage", ["torn", "zeros", "garbage"])
def test_partition_log_tail_damage_is_truncated_with_a_warning(
    partition_dir: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    last = sorted(partition_dir.glob("*.log"))[-1]
    data = last.read_bytes()
    size = len(data)
    last.write_bytes(
        {
            "torn": data[:-7],
            "zeros": data + bytes(500),
            "garbage": data + random.Random(1).randbytes(90),
        }[damage]
    )
    with caplog.at_level(logging.WARNING, logger="broker.replica.partition_log"):
        plog = _reopen(partition_dir)
    try:
        assert plog.log_end_offset == (11 if damage == "torn" else 12)
        if damage != "torn":
            assert last.stat().st_size == size
    finally:
        plog.close()
    assert any(
        str(partition_dir) in r.getMessage() or last.name in r.getMessage() for r in caplog.records
    ), caplog.text


def test_partition_log_mid_log_corruption_truncates_from_the_bad_batch(
    partition_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Kafka's log recovery of segments not below the recovery point (here none is: the
    checkpoint is gone, as after a crash before the first flush): the bad batch and everything
    after it go (the replica refetches them from the leader); the warning names the file and
    byte."""
    first = sorted(partition_dir.glob("*.log"))[0]
    data = bytearray(first.read_bytes())
    data[70] ^= 0x01  # inside the first batch's records (covered by its CRC)
    first.write_bytes(bytes(data))
    (partition_dir / RECOVERY_POINT_FILE).unlink()
    with caplog.at_level(logging.WARNING, logger="broker.replica.partition_log"):
        plog = _reopen(partition_dir)
    try:
        assert plog.log_end_offset == 0
        assert plog.high_watermark == 0
    finally:
        plog.close()
    assert any(
        first.name in r.getMessage() and "byte 0" in r.getMessage() for r in caplog.records
    ), caplog.text


def test_partition_log_corruption_below_the_recovery_point_is_refused_when_read(
    partition_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After a clean close the next open scans nothing (Kafka's recovery point); the damaged
    batch is refused when read (the fetch answers CORRUPT_MESSAGE), naming file and byte."""
    first = sorted(partition_dir.glob("*.log"))[0]
    data = bytearray(first.read_bytes())
    data[70] ^= 0x01
    first.write_bytes(bytes(data))
    plog = _reopen(partition_dir)
    try:
        assert plog.log_end_offset == 12
        with caplog.at_level(logging.ERROR, logger="broker.replica.partition_log"):
            with pytest.raises(CorruptRecordError, match="batch at byte 0 .* CRC mismatch"):
                plog.read(0)
        assert plog.read(int(plog.segment_files()[1].stem))  # the next segment reads
    finally:
        plog.close()
    assert any(first.name in r.getMessage() for r in caplog.records), caplog.text


@pytest.mark.parametrize(
    "content", ["", "garbage", "0\n1\n", "0\n1\nnot-a-number\n", "7\n1\n5\n", "0\n3\n5\n"]
)
def test_partition_checkpoint_files_damaged(
    partition_dir: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    (partition_dir / HW_FILE).write_text(content)
    (partition_dir / LEADER_EPOCH_FILE).write_text(content)
    with caplog.at_level(logging.WARNING, logger="broker.replica.partition_log"):
        plog = _reopen(partition_dir)
    try:
        assert 0 <= plog.high_watermark <= plog.log_end_offset == 12
    finally:
        plog.close()
    assert any(HW_FILE in r.getMessage() for r in caplog.records), caplog.text
    assert any(LEADER_EPOCH_FILE in r.getMessage() for r in caplog.records), caplog.text


def test_partition_checkpoint_file_missing(partition_dir: Path) -> None:
    os.unlink(partition_dir / HW_FILE)
    plog = _reopen(partition_dir)
    try:
        assert plog.high_watermark == 0 and plog.log_end_offset == 12
    finally:
        plog.close()
