"""Idempotent-producer state: duplicates, sequence and epoch checks, and its rebuild from the
log (replay, snapshots, truncation) in a real partition log on disk."""

from __future__ import annotations

import datetime
import io

import pytest
from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_new_batch
from kio.static.primitive import i8, i16, i32, i64

from broker.replica.partition_log import (
    InvalidBatchError,
    PartitionLog,
    RecordTooLargeError,
)
from broker.replica.producer_state import (
    INT32_MAX,
    ProducerStateError,
    ProducerStateManager,
    SnapshotError,
    decode_snapshot,
    encode_snapshot,
    last_sequence,
)


def idem_batch(pid: int, epoch: int, seq: int, count: int = 2, value: bytes = b"v") -> bytes:
    now = datetime.datetime.now(datetime.UTC)
    records = tuple(
        Record(attributes=i8(0), timestamp=now, offset=i64(i), key=None, value=value, headers=())
        for i in range(count)
    )
    buf = io.BytesIO()
    write_new_batch(
        buf,
        NewRecordBatch(
            producer_id=i64(pid),
            producer_epoch=i16(epoch),
            base_sequence=i32(seq),
            records=records,
            attributes=i16(0),
        ),
    )
    return buf.getvalue()


# ---- pure state ----------------------------------------------------------------------------


def test_sequences_wrap_after_int32_max():
    assert last_sequence(5, 3) == 8
    assert last_sequence(INT32_MAX, 1) == 0
    assert last_sequence(INT32_MAX - 1, 3) == 1


def test_new_producer_may_start_anywhere_then_must_continue():
    s = ProducerStateManager()
    assert s.check(7, 0, 42, 43) is None
    s.update(7, 0, 42, 43, 100, 101)
    assert s.check(7, 0, 44, 45) is None
    with pytest.raises(ProducerStateError) as e:
        s.check(7, 0, 46, 47)  # a gap
    assert e.value.error == "out_of_order_sequence_number"


def test_duplicate_of_any_of_the_last_five_batches_returns_its_offsets():
    s = ProducerStateManager()
    for i in range(7):
        s.update(1, 0, 2 * i, 2 * i + 1, 10 * i, 10 * i + 1)
    dup = s.check(1, 0, 6, 7)
    assert dup is not None and (dup.first_offset, dup.last_offset) == (30, 31)
    with pytest.raises(ProducerStateError):  # batch 1 fell out of the window: not in sequence
        s.check(1, 0, 2, 3)


def test_older_epoch_is_fenced_and_newer_epoch_restarts_at_zero():
    s = ProducerStateManager()
    s.update(1, 3, 0, 9, 0, 9)
    with pytest.raises(ProducerStateError) as e:
        s.check(1, 2, 10, 11)
    assert e.value.error == "invalid_producer_epoch"
    with pytest.raises(ProducerStateError) as e:
        s.check(1, 4, 10, 11)
    assert e.value.error == "out_of_order_sequence_number"
    assert s.check(1, 4, 0, 1) is None
    s.update(1, 4, 0, 1, 10, 11)
    assert s.producers[1].epoch == 4 and len(s.producers[1].batches) == 1
    s.update(1, 3, 10, 11, 12, 13)  # a fenced producer's late batch replayed: ignored
    assert s.producers[1].epoch == 4 and s.producers[1].last_offset == 11


def test_snapshot_round_trip_and_corruption_is_detected():
    s = ProducerStateManager()
    s.update(1, 0, 0, 4, 0, 4, timestamp=99)
    s.update(2, 1, 5, 5, 5, 5)
    data = encode_snapshot(s)
    back = decode_snapshot(data)
    assert back.producers == s.producers
    with pytest.raises(SnapshotError):
        decode_snapshot(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(SnapshotError):
        decode_snapshot(b"junk")


# ---- in a partition log ------------------------------------------------------------------


def test_leader_append_dedups_and_refuses_out_of_order(tmp_path):
    plog = PartitionLog.open(tmp_path / "t-0")
    first = plog.append_as_leader(idem_batch(5, 0, 0), leader_epoch=1)
    assert (first.first_offset, first.last_offset, first.duplicate) == (0, 1, False)
    plog.append(idem_batch(-1, -1, -1, count=3))  # a non-idempotent batch in between
    again = plog.append_as_leader(idem_batch(5, 0, 0), leader_epoch=1)
    assert (again.first_offset, again.last_offset, again.duplicate) == (0, 1, True)
    assert plog.log_end_offset == 5  # nothing appended for the retry
    with pytest.raises(ProducerStateError):
        plog.append_as_leader(idem_batch(5, 0, 5), leader_epoch=1)
    assert plog.log_end_offset == 5
    assert plog.append_as_leader(idem_batch(5, 0, 2), leader_epoch=1).first_offset == 5


def test_leader_append_size_limit_and_one_batch_rule(tmp_path):
    plog = PartitionLog.open(tmp_path / "t-0")
    big = idem_batch(-1, -1, -1, count=1, value=b"x" * 2000)
    with pytest.raises(RecordTooLargeError):
        plog.append_as_leader(big, leader_epoch=0, max_batch_bytes=1000)
    with pytest.raises(InvalidBatchError):
        plog.append_as_leader(idem_batch(1, 0, 0) + idem_batch(1, 0, 2), leader_epoch=0)
    assert plog.log_end_offset == 0


def test_follower_appends_build_the_same_state(tmp_path):
    leader = PartitionLog.open(tmp_path / "l")
    for seq in range(0, 10, 2):
        leader.append_as_leader(idem_batch(9, 0, seq), leader_epoch=1)
    follower = PartitionLog.open(tmp_path / "f")
    follower.append_as_follower(leader.read(0, max_bytes=1 << 30))
    assert follower.producers.producers == leader.producers.producers
    dup = follower.append_as_leader(idem_batch(9, 0, 8), leader_epoch=2)  # after a failover
    assert dup.duplicate and dup.first_offset == 8


def test_restart_rebuilds_from_snapshot_plus_tail(tmp_path):
    d = tmp_path / "t-0"
    plog = PartitionLog.open(d, segment_bytes=600)
    for seq in range(0, 40, 2):
        plog.append_as_leader(idem_batch(3, 0, seq), leader_epoch=0)
    snapshots = sorted(d.glob("*.snapshot"))
    assert 1 <= len(snapshots) <= 2  # written at segment rolls, the two newest kept
    expected = plog.producers.producers
    # a kill -9: no close(), so the tail after the last roll is replayed
    reopened = PartitionLog.open(d, segment_bytes=600)
    assert reopened.producers.producers == expected
    replayed, _ = reopened.producer_rebuild
    assert 0 < replayed < 20
    assert reopened.append_as_leader(idem_batch(3, 0, 38), leader_epoch=0).duplicate
    reopened.close()
    clean = PartitionLog.open(d, segment_bytes=600)
    assert clean.producer_rebuild[0] == 0  # the close snapshot covers everything
    assert clean.producers.producers == expected


def test_corrupt_snapshot_falls_back_to_replay(tmp_path):
    d = tmp_path / "t-0"
    plog = PartitionLog.open(d)
    for seq in range(0, 10, 2):
        plog.append_as_leader(idem_batch(3, 0, seq), leader_epoch=0)
    plog.close()
    (snap,) = d.glob("*.snapshot")
    snap.write_bytes(b"PSN1garbage")
    reopened = PartitionLog.open(d)
    assert reopened.producers.producers[3].last_seq == 9
    assert reopened.producer_rebuild[0] == 5


def test_truncation_rebuilds_state(tmp_path):
    d = tmp_path / "t-0"
    plog = PartitionLog.open(d)
    for seq in range(0, 10, 2):
        plog.append_as_leader(idem_batch(3, 0, seq), leader_epoch=0)
    plog.close()
    plog = PartitionLog.open(d)  # a snapshot at offset 10 exists now
    plog.truncate_to(6)
    assert not list(d.glob(f"{10:020d}.snapshot"))
    assert plog.producers.producers[3].last_seq == 5
    assert plog.append_as_leader(idem_batch(3, 0, 6), leader_epoch=1).first_offset == 6


def test_replay_keeps_only_the_newest_epoch_and_last_five(tmp_path):
    d = tmp_path / "t-0"
    plog = PartitionLog.open(d)
    for seq in range(0, 20, 2):
        plog.append_as_leader(idem_batch(3, 0, seq), leader_epoch=0)
    plog.append_as_leader(idem_batch(3, 1, 0), leader_epoch=0)
    for seq in range(0, 14, 2):
        plog.append_as_leader(idem_batch(4, 0, seq), leader_epoch=0)
    expected = {pid: (e.epoch, list(e.batches)) for pid, e in plog.producers.producers.items()}
    reopened = PartitionLog.open(d)  # no snapshot: everything replayed
    got = {pid: (e.epoch, list(e.batches)) for pid, e in reopened.producers.producers.items()}
    assert got == expected
    assert got[3][0] == 1 and len(got[3][1]) == 1 and len(got[4][1]) == 5


def test_idle_producers_expire_but_not_with_an_open_transaction() -> None:
    state = ProducerStateManager()
    state.update(1, 0, 0, 1, 0, 1, timestamp=1_000)
    state.update(2, 0, 0, 1, 2, 3, timestamp=5_000)
    state.update_epoch(3, 0)  # a marker only: no timestamp, never expires
    assert state.remove_expired(10_999, 10_000) == 0
    assert state.remove_expired(11_000, 10_000, keep=[1]) == 0  # 1 has a transaction open
    assert state.remove_expired(11_000, 10_000) == 1
    assert sorted(state.producers) == [2, 3]
    assert state.remove_expired(10**9, 10_000) == 1 and sorted(state.producers) == [3]


def test_an_expired_producer_starts_over_in_its_partition(tmp_path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0")
    plog.append_as_leader(idem_batch(7, 0, 0), leader_epoch=1)
    plog.append_as_leader(idem_batch(7, 0, 2), leader_epoch=1)
    now = max(e.last_timestamp for e in plog.producers.producers.values())
    assert plog.expire_producers(now + 60_000, 86_400_000) == 0
    assert plog.expire_producers(now + 86_400_000, 86_400_000) == 1
    # forgotten: a batch at sequence 0 is new again, not a duplicate of the first
    again = plog.append_as_leader(idem_batch(7, 0, 0), leader_epoch=1)
    assert not again.duplicate and plog.log_end_offset == 6
    plog.close()
