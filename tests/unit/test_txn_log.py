"""Transactions in a partition log: markers, the last stable offset, the aborted index, and
their rebuild from the log after a restart or truncation (a real log on disk)."""

from __future__ import annotations

import datetime
import io
import struct
from pathlib import Path

import pytest
from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_new_batch
from kio.static.primitive import i8, i16, i32, i64

from broker.replica.control_batch import ATTR_CONTROL, ATTR_TRANSACTIONAL, encode_marker
from broker.replica.partition_log import PartitionLog, parse_batches
from broker.replica.producer_state import ProducerStateError
from broker.replica.txn_index import AbortedTxn, TxnIndex


def txn_batch(pid: int, epoch: int, seq: int, count: int = 2) -> bytes:
    now = datetime.datetime.now(datetime.UTC)
    records = tuple(
        Record(attributes=i8(0), timestamp=now, offset=i64(i), key=None, value=b"v", headers=())
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
            attributes=i16(ATTR_TRANSACTIONAL),
        ),
    )
    return buf.getvalue()


def test_marker_batch_is_a_valid_control_batch() -> None:
    data = encode_marker(7, 3, True, 5, 1000)
    [info], used = parse_batches(data)
    assert used == len(data)
    assert info.transactional and info.control_type == 1
    assert (info.producer_id, info.producer_epoch, info.base_sequence) == (7, 3, -1)
    (attrs,) = struct.unpack_from(">h", data, 21)
    assert attrs & ATTR_CONTROL
    [abort], _ = parse_batches(encode_marker(7, 3, False, 5, 1000))
    assert abort.control_type == 0


def test_index_lso_and_aborted() -> None:
    idx = TxnIndex()
    idx.on_batch(1, 0, 1, True, -1)  # producer 1 opens at 0
    idx.on_batch(2, 2, 3, True, -1)  # producer 2 opens at 2
    idx.on_batch(3, 4, 4, False, -1)  # idempotent, not transactional
    assert idx.last_stable_offset(5) == 0
    idx.on_batch(1, 5, 5, True, 0)  # abort marker of producer 1
    assert idx.last_stable_offset(5) == 0  # marker not yet below the high watermark
    assert idx.last_stable_offset(6) == 2
    idx.on_batch(2, 6, 6, True, 1)  # commit of producer 2
    assert idx.last_stable_offset(7) == 7
    assert idx.aborted == [AbortedTxn(1, 0, 5)]
    assert idx.aborted_in(0, 7) == [AbortedTxn(1, 0, 5)]
    assert idx.aborted_in(6, 7) == []
    assert idx.aborted_in(0, 0) == []
    idx.remove_before(6)
    assert idx.aborted == []


def test_log_tracks_transactions_and_survives_reopen(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0")
    plog.append_as_leader(txn_batch(10, 0, 0), 1)  # offsets 0-1
    plog.append_as_leader(txn_batch(11, 0, 0), 1)  # offsets 2-3
    plog.set_high_watermark(plog.log_end_offset)
    assert plog.last_stable_offset == 0
    assert plog.append_marker(10, 0, False, 0, 1, 1000) == 4
    plog.set_high_watermark(plog.log_end_offset)
    assert plog.last_stable_offset == 2
    assert plog.aborted_transactions(0, 5) == [AbortedTxn(10, 0, 4)]
    plog.close()

    reopened = PartitionLog.open(tmp_path / "t-0")
    assert reopened.last_stable_offset == 2  # producer 11 still open: rebuilt from the log
    assert reopened.aborted_transactions(0, 5) == [AbortedTxn(10, 0, 4)]
    reopened.append_marker(11, 0, True, 0, 1, 1000)
    reopened.set_high_watermark(reopened.log_end_offset)
    assert reopened.last_stable_offset == reopened.log_end_offset == 6
    # the producer continues with its sequence after the marker
    reopened.append_as_leader(txn_batch(10, 0, 2), 1)
    assert reopened.last_stable_offset == 6
    reopened.close()


def test_truncation_reopens_a_transaction(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0")
    plog.append_as_leader(txn_batch(10, 0, 0), 1)
    plog.append_marker(10, 0, True, 0, 1, 1000)
    plog.set_high_watermark(plog.log_end_offset)
    assert plog.last_stable_offset == 3
    plog.truncate_to(2)  # the marker is gone: the transaction is open again
    assert plog.last_stable_offset == 0
    plog.close()


def test_bumped_epoch_marker_fences_older_batches(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0")
    plog.append_as_leader(txn_batch(10, 0, 0), 1)
    plog.append_marker(10, 1, False, 0, 1, 1000)  # timeout abort with a bumped epoch
    with pytest.raises(ProducerStateError) as e:  # the zombie's late batch
        plog.append_as_leader(txn_batch(10, 0, 2), 1)
    assert e.value.error == "invalid_producer_epoch"
    plog.close()
    reopened = PartitionLog.open(tmp_path / "t-0")  # the marker's epoch is rebuilt from the log
    with pytest.raises(ProducerStateError):
        reopened.append_as_leader(txn_batch(10, 0, 2), 1)
    reopened.append_as_leader(txn_batch(10, 2, 0), 1)  # the next producer instance
    reopened.close()


@pytest.mark.parametrize("version", [4, 11, 12])
def test_fetch_response_carries_aborted_transactions(version: int) -> None:
    from kio.index import load_response_schema
    from kio.serial import entity_reader

    from broker.protocol.data_codec import FetchPartitionResult, write_fetch_response

    body = write_fetch_response(
        version, 0, [("t", [FetchPartitionResult(0, 0, 9, 4, 0, b"", [(10, 0), (11, 2)])])]
    )
    cls = load_response_schema(1, version)
    resp, size = entity_reader(cls)(body, 0)
    assert size == len(body)
    p = resp.responses[0].partitions[0]
    assert p.last_stable_offset == 4
    assert [(a.producer_id, a.first_offset) for a in p.aborted_transactions] == [(10, 0), (11, 2)]
