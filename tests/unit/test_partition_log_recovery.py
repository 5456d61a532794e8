"""Partition-log recovery point and batch index: a clean close makes the next open scan
nothing; a kill -9 scans only what was not flushed; every way an index could be stale or
damaged falls back to a scan; damage below the recovery point is found when read."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from broker.replica.batch_index import INDEX_SUFFIX
from broker.replica.partition_log import (
    RECOVERY_POINT_FILE,
    CorruptRecordError,
    PartitionLog,
    parse_batches,
)
from tests.unit.test_partition_log import make_batch, values_in
from tests.unit.test_producer_state import idem_batch


def _open(d: Path) -> PartitionLog:
    return PartitionLog.open(d, segment_bytes=300)


def _fill(plog: PartitionLog, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        plog.append(idem_batch(7, 0, i * 2, value=b"%03d" % i), leader_epoch=0)


def _all_values(plog: PartitionLog) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    offset = plog.log_start_offset
    while offset < plog.log_end_offset:
        got = values_in(plog.read(offset))
        out += got
        offset = got[-1][0] + 1
    return out


def _recovery_point(d: Path) -> int:
    return int((d / RECOVERY_POINT_FILE).read_text().split()[2])


def test_clean_close_then_open_scans_nothing(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    plog = _open(d)
    _fill(plog, 20)
    before = _all_values(plog)
    segments = len(plog.segment_files())
    assert segments >= 4
    assert _recovery_point(d) == int(plog.segment_files()[-1].stem)  # the last roll
    plog.close()
    assert _recovery_point(d) == 40
    assert len(list(d.glob(f"*{INDEX_SUFFIX}"))) == segments
    again = _open(d)
    assert again.opened == (segments, 0)
    assert again.log_end_offset == 40
    assert _all_values(again) == before
    assert again.producers.producers[7].last_seq == 39
    assert again.append_as_leader(idem_batch(7, 0, 40), 0).first_offset == 40
    again.close()


def test_kill_9_scans_only_above_the_recovery_point_and_cuts_a_torn_tail(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "t-0"
    plog = _open(d)
    _fill(plog, 20)
    before = _all_values(plog)
    active = plog.segment_files()[-1]
    segments = len(plog.segment_files())
    plog.append(make_batch([b"torn"]), leader_epoch=0)
    plog.abandon()  # a kill -9: nothing written at close
    active.write_bytes(active.read_bytes()[:-5])
    with caplog.at_level(logging.WARNING):
        again = _open(d)
    assert "torn" in caplog.text and str(active) in caplog.text
    assert again.opened == (segments - 1, 1)
    assert again.log_end_offset == 40
    assert _all_values(again) == before
    assert again.producers.producers[7].last_seq == 39
    again.close()
    third = _open(d)
    assert third.opened == (segments, 0)
    third.close()


def test_appends_after_an_open_from_the_index_are_scanned_after_a_kill(tmp_path: Path) -> None:
    """The active segment was indexed at the clean close; appends make that index stale (its
    size no longer matches) and leave the recovery point behind them."""
    d = tmp_path / "t-0"
    plog = _open(d)
    _fill(plog, 3)
    plog.close()
    again = _open(d)
    _fill(again, 1, start=3)
    again.abandon()
    third = _open(d)
    assert third.opened[1] == 1
    assert [v for _, v in _all_values(third)][-2:] == [b"003", b"003"]
    assert third.producers.producers[7].last_seq == 7
    third.close()


def test_truncation_lowers_the_recovery_point_and_drops_stale_indexes(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    plog = _open(d)
    _fill(plog, 20)
    plog.close()
    plog = _open(d)
    bases = [int(p.stem) for p in plog.segment_files()]
    cut = bases[2] + 2  # inside the third segment: the later ones go, the third is cut
    plog.truncate_to(cut)
    assert _recovery_point(d) == plog.recovery_point == cut
    assert not (d / f"{bases[2]:020d}{INDEX_SUFFIX}").exists()
    assert not (d / f"{bases[3]:020d}{INDEX_SUFFIX}").exists()
    # regrow past the old segment names with other values, then crash
    for i in range(cut // 2, 20):
        plog.append(make_batch([b"new%d" % i, b"x"]), leader_epoch=1)
    expected = _all_values(plog)
    plog.abandon()
    again = _open(d)
    assert _all_values(again) == expected
    assert again.opened[1] == 1  # the active segment: the rest was flushed at its rolls
    again.close()


def test_a_damaged_index_falls_back_to_a_scan(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    plog = _open(d)
    _fill(plog, 10)
    before = _all_values(plog)
    plog.close()
    index = sorted(d.glob(f"*{INDEX_SUFFIX}"))[1]
    raw = bytearray(index.read_bytes())
    raw[30] ^= 0x10
    index.write_bytes(bytes(raw))
    (sorted(d.glob(f"*{INDEX_SUFFIX}"))[0]).write_bytes(b"")
    again = _open(d)
    assert again.opened[1] == 2
    assert _all_values(again) == before
    again.close()
    assert _open(d).opened[1] == 0  # rewritten at the clean close


def test_an_unreadable_recovery_point_means_a_full_scan(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "t-0"
    plog = _open(d)
    _fill(plog, 10)
    plog.close()
    (d / RECOVERY_POINT_FILE).write_text("garbage")
    with caplog.at_level(logging.WARNING):
        again = _open(d)
    assert RECOVERY_POINT_FILE in caplog.text
    assert again.opened == (0, len(again.segment_files()))
    assert again.log_end_offset == 20
    again.close()


def test_a_log_written_before_the_recovery_point_gets_its_indexes_at_close(
    tmp_path: Path,
) -> None:
    d = tmp_path / "t-0"
    plog = _open(d)
    _fill(plog, 10)
    plog.close()
    for f in [*d.glob(f"*{INDEX_SUFFIX}"), d / RECOVERY_POINT_FILE]:
        f.unlink()
    again = _open(d)
    n = len(again.segment_files())
    assert again.opened == (0, n)
    again.close()
    assert _open(d).opened == (n, 0)


def test_a_segment_cut_short_below_the_recovery_point_is_scanned(tmp_path: Path) -> None:
    """A file shorter than its index (lost writes after a power cut): the size check sends it
    to a scan, which truncates it and removes every segment after it."""
    d = tmp_path / "t-0"
    plog = _open(d)
    _fill(plog, 10)
    plog.close()
    first = sorted(d.glob("*.log"))[0]
    infos, _ = parse_batches(first.read_bytes())
    first.write_bytes(first.read_bytes()[: infos[1].position + 3])
    again = _open(d)
    assert again.log_end_offset == infos[0].last_offset + 1
    assert len(again.segment_files()) == 1
    again.close()


def test_a_batch_moved_under_its_index_is_refused_when_read(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    plog = _open(d)
    _fill(plog, 4)
    plog.close()
    first = sorted(d.glob("*.log"))[0]
    raw = bytearray(first.read_bytes())
    raw[7] ^= 0x01  # the first batch's base offset (outside its CRC)
    first.write_bytes(bytes(raw))
    again = _open(d)
    with pytest.raises(CorruptRecordError, match="header says offset 1"):
        again.read(0)
    again.close()


def test_a_fetch_of_a_damaged_batch_answers_corrupt_message(tmp_path: Path) -> None:
    """The broker side: a replica manager closed cleanly, a byte flipped, reopened (from the
    index, no scan): the fetch of that partition answers CORRUPT_MESSAGE and no bytes; a fetch
    above the damage still reads."""
    import uuid

    from broker.protocol.data_codec import FetchPartition
    from broker.protocol.fetch import FetchHandler
    from broker.replica.replica_manager import ReplicaManager
    from kraft.errors import ErrorCode
    from kraft.records import TopicRecord
    from tests.unit.test_replica_manager import Cluster, partition

    topic_id = str(uuid.UUID(int=7))
    records = (TopicRecord("t", topic_id), partition(topic_id, 0, [1], 1))
    rm = ReplicaManager(1, [tmp_path / "a"])
    Cluster(rm).step(*records)
    plog = rm.get(topic_id, 0).log
    for v in (b"a", b"b"):
        plog.append(make_batch([v]), leader_epoch=0)
    plog.set_high_watermark(2)
    rm.close()
    segment = plog.segment_files()[0]
    raw = bytearray(segment.read_bytes())
    raw[parse_batches(bytes(raw))[0][0].size - 1] ^= 0xFF  # the first batch's last byte
    segment.write_bytes(bytes(raw))

    rm = ReplicaManager(1, [tmp_path / "a"])
    Cluster(rm).step(*records)
    assert rm.get(topic_id, 0).log.opened == (1, 0)
    handler = FetchHandler(rm)
    for offset, error, got in ((0, ErrorCode.CORRUPT_MESSAGE, b""), (1, 0, b"b")):
        result, _ = handler._read_partition(
            "t", FetchPartition(0, -1, offset, 0, 1 << 20), False, -1, 0, 1 << 20
        )
        assert result.error_code == error
        assert [v for _, v in values_in(result.records or b"")] == ([got] if got else [])
    rm.close()
