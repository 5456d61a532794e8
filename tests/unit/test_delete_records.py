"""DeleteRecords on a partition log: the log start offset moves up (inside a segment too),
whole segments below it are deleted, it survives a restart, and reads below it are refused."""

from __future__ import annotations

import pytest

from broker.replica.partition_log import LOG_START_FILE, PartitionLog
from tests.unit.test_partition_log import make_batch, values_in


def test_log_start_moves_segments_go_and_it_survives_reopen(tmp_path):
    d = tmp_path / "t-0"
    plog = PartitionLog.open(d, segment_bytes=300)
    for i in range(20):
        plog.append(make_batch([b"v%d" % i]), leader_epoch=0)
    segments = len(plog.segment_files())
    assert segments > 3
    assert plog.delete_records_before(13) == 13
    assert len(plog.segment_files()) < segments
    assert plog.segment_files()[0].name <= f"{13:020d}.log"
    with pytest.raises(ValueError):
        plog.read(12)
    assert values_in(plog.read(13))[0] == (13, b"v13")
    assert plog.delete_records_before(5) == 13  # never moves down
    assert plog.delete_records_before(99) == 20  # at most the log end
    plog.close()
    assert (d / LOG_START_FILE).read_text().split() == ["0", "1", "20"]
    reopened = PartitionLog.open(d, segment_bytes=300)
    assert reopened.log_start_offset == 20 and reopened.log_end_offset == 20
    reopened.append(make_batch([b"next"]), leader_epoch=0)
    assert values_in(reopened.read(20)) == [(20, b"next")]


def test_producers_wholly_below_the_new_log_start_are_forgotten(tmp_path):
    from tests.unit.test_producer_state import idem_batch

    d = tmp_path / "t-0"
    plog = PartitionLog.open(d)
    plog.append_as_leader(idem_batch(1, 0, 0), leader_epoch=0)  # offsets 0-1
    plog.append_as_leader(idem_batch(2, 0, 0), leader_epoch=0)  # offsets 2-3
    plog.delete_records_before(2)
    assert set(plog.producers.producers) == {2}
    plog.close()
    assert set(PartitionLog.open(d).producers.producers) == {2}
