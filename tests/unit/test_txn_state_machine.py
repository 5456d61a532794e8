"""The pure transaction coordinator state machine and its ``__transaction_state`` records."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode as E

from broker.coordinator.txn.records import (
    COMPLETE_ABORT,
    COMPLETE_COMMIT,
    EMPTY,
    ONGOING,
    PREPARE_ABORT,
    PREPARE_COMMIT,
    TxnKey,
    TxnRecordError,
    TxnValue,
    decode_record,
    encode_key,
    encode_value,
)
from broker.coordinator.txn.state_machine import TxnConfig, TxnShard

T = "tok"


def _init(shard: TxnShard, tid: str = "t1", new_pid: int | None = 100, now: int = 0) -> dict:
    out = shard.init_producer_id(tid, 60_000, -1, -1, new_pid, T, now)
    return out.completions[0][1]


def _replayed(shard: TxnShard, records: list) -> TxnShard:
    """A fresh shard fed ``records`` (what a coordinator loading the partition sees)."""
    fresh = TxnShard(shard.config)
    for key, value in records:
        fresh.replay(decode_record(encode_key(key), encode_value(value)))
    return fresh


def test_records_round_trip() -> None:
    value = TxnValue(7, 3, 60_000, ONGOING, (("a", 0), ("a", 2), ("b", 1)), 123, 100)
    key, back = decode_record(encode_key(TxnKey("x")), encode_value(value))
    assert key == TxnKey("x") and back == value
    assert decode_record(encode_key(TxnKey("x")), None) == (TxnKey("x"), None)


def test_records_refuse_garbage() -> None:
    with pytest.raises(TxnRecordError):
        decode_record(b"\x00\x05ab", None)
    with pytest.raises(TxnRecordError):
        decode_record(encode_key(TxnKey("x")), b"\x00\x00\x01")


def test_init_gives_a_new_id_then_bumps_the_epoch() -> None:
    shard = TxnShard()
    assert _init(shard) == {"error_code": E.none, "producer_id": 100, "producer_epoch": 0}
    assert _init(shard, new_pid=None) == {
        "error_code": E.none,
        "producer_id": 100,
        "producer_epoch": 1,
    }
    assert shard.txns["t1"].state == EMPTY


def test_init_refuses_bad_timeout_and_empty_id() -> None:
    shard = TxnShard(TxnConfig(max_timeout_ms=1000))
    out = shard.init_producer_id("t1", 5000, -1, -1, 1, T, 0)
    assert out.completions[0][1]["error_code"] == E.invalid_transaction_timeout
    assert not out.records and not shard.txns
    out = shard.init_producer_id("", 500, -1, -1, 1, T, 0)
    assert out.completions[0][1]["error_code"] == E.invalid_request


def test_commit_flow_and_markers() -> None:
    shard = TxnShard()
    _init(shard)
    res, code = shard.add_partitions("t1", 100, 0, [("a", 0), ("b", 1)], T, 10)
    assert code == E.none and shard.txns["t1"].state == ONGOING
    res, code = shard.add_partitions("t1", 100, 0, [("a", 0)], T, 11)
    assert code == E.none and not res.records  # nothing new: no write
    res, code = shard.end_txn("t1", 100, 0, True, T, 20)
    assert code == E.none and shard.txns["t1"].state == PREPARE_COMMIT
    [pending] = shard.pending_markers()
    assert pending.commit and pending.partitions == {("a", 0), ("b", 1)}
    # a retry while the markers are written
    assert shard.end_txn("t1", 100, 0, True, T, 21)[1] == E.concurrent_transactions
    assert shard.add_partitions("t1", 100, 0, [("c", 0)], T, 21)[1] == E.concurrent_transactions
    shard.complete("t1", 100, 0, 30)
    assert shard.txns["t1"].state == COMPLETE_COMMIT and not shard.txns["t1"].partitions
    assert not shard.pending_markers()
    assert shard.end_txn("t1", 100, 0, True, T, 31)[1] == E.none  # retried after completion
    assert shard.end_txn("t1", 100, 0, False, T, 31)[1] == E.invalid_txn_state


def test_abort_flow() -> None:
    shard = TxnShard()
    _init(shard)
    shard.add_partitions("t1", 100, 0, [("a", 0)], T, 10)
    shard.end_txn("t1", 100, 0, False, T, 20)
    assert shard.txns["t1"].state == PREPARE_ABORT
    assert not shard.pending_markers()[0].commit
    shard.complete("t1", 100, 0, 30)
    assert shard.txns["t1"].state == COMPLETE_ABORT


def test_end_txn_without_transaction_is_invalid_state() -> None:
    shard = TxnShard()
    _init(shard)
    assert shard.end_txn("t1", 100, 0, True, T, 1)[1] == E.invalid_txn_state


def test_zombie_is_fenced() -> None:
    shard = TxnShard()
    _init(shard)
    _init(shard, new_pid=None)  # the new producer instance: epoch 1
    assert shard.add_partitions("t1", 100, 0, [("a", 0)], T, 5)[1] == E.producer_fenced
    assert shard.end_txn("t1", 100, 0, True, T, 5)[1] == E.producer_fenced
    assert shard.add_partitions("t1", 999, 1, [("a", 0)], T, 5)[1] == (
        E.invalid_producer_id_mapping
    )
    assert shard.add_partitions("nope", 100, 1, [("a", 0)], T, 5)[1] == (
        E.invalid_producer_id_mapping
    )
    out = shard.init_producer_id("t1", 60_000, 100, 0, None, T, 6)  # KIP-360 with old epoch
    assert out.completions[0][1]["error_code"] == E.producer_fenced


def test_init_aborts_an_open_transaction_first() -> None:
    shard = TxnShard()
    _init(shard)
    shard.add_partitions("t1", 100, 0, [("a", 0)], T, 10)
    assert _init(shard, new_pid=None)["error_code"] == E.concurrent_transactions
    t = shard.txns["t1"]
    assert t.state == PREPARE_ABORT and t.producer_epoch == 1  # the old producer is fenced
    [pending] = shard.pending_markers()
    assert pending.producer_epoch == 1 and not pending.commit
    assert _init(shard, new_pid=None)["error_code"] == E.concurrent_transactions
    shard.complete("t1", 100, 1, 20)
    assert _init(shard, new_pid=None) == {
        "error_code": E.none,
        "producer_id": 100,
        "producer_epoch": 2,
    }


def test_timeout_aborts_and_fences() -> None:
    shard = TxnShard()
    shard.init_producer_id("t1", 1000, -1, -1, 100, T, 0)
    shard.add_partitions("t1", 100, 0, [("a", 0)], T, 10)
    assert shard.next_deadline() == 1010
    assert not shard.tick(1009).records
    res = shard.tick(1010)
    assert len(res.records) == 1
    t = shard.txns["t1"]
    assert t.state == PREPARE_ABORT and t.producer_epoch == 1
    assert shard.next_deadline() is None
    assert shard.end_txn("t1", 100, 0, True, T, 1011)[1] == E.producer_fenced


def test_epoch_exhaustion_takes_a_new_producer_id() -> None:
    shard = TxnShard()
    _init(shard)
    shard.txns["t1"].producer_epoch = 32766
    assert shard.needs_new_producer_id("t1")
    assert _init(shard, new_pid=None)["error_code"] == E.coordinator_not_available
    assert _init(shard, new_pid=555) == {
        "error_code": E.none,
        "producer_id": 555,
        "producer_epoch": 0,
    }


def test_state_survives_replay() -> None:
    shard = TxnShard()
    records: list = []
    records += shard.init_producer_id("t1", 60_000, -1, -1, 100, T, 0).records
    records += shard.add_partitions("t1", 100, 0, [("a", 0)], T, 10)[0].records
    records += shard.end_txn("t1", 100, 0, True, T, 20)[0].records
    loaded = _replayed(shard, records)
    assert loaded.txns == shard.txns
    [pending] = loaded.pending_markers()  # a new coordinator finishes what the old one began
    assert pending.commit and pending.partitions == {("a", 0)}
    loaded.replay((TxnKey("t1"), None))
    assert not loaded.txns


def test_txn_offsets_wait_for_their_marker() -> None:
    from broker.coordinator.group.state_machine import CommitPartition, GroupShard

    groups = GroupShard()
    parts = [CommitPartition("in", 0, 42, -1, None), CommitPartition("in", 1, 7, -1, "m")]
    out, errors = groups.txn_commit("g", 100, 3, parts, 5)
    assert errors == [E.none, E.none]
    assert out.producer == (100, 3) and len(out.records) == 2  # a transactional batch
    assert groups.fetch_offsets("g", [("in", [0, 1])]) == [("in", [(0, None), (1, None)])]
    assert groups.unstable_offsets("g") == {("in", 0), ("in", 1)}
    assert groups.unstable_offsets("other") == set()
    assert not groups.complete_txn(100, False, 6).records  # aborted: dropped
    assert groups.unstable_offsets("g") == set()
    groups.txn_commit("g", 100, 3, parts, 7)
    assert not groups.complete_txn(100, True, 8).records  # the replicated marker is the record
    [(_, found)] = groups.fetch_offsets("g", [("in", [0, 1])])
    assert [(p, v.offset if v else None) for p, v in found] == [(0, 42), (1, 7)]


def test_idle_transactional_ids_expire_with_a_tombstone() -> None:
    from broker.coordinator.txn.records import decode_record, encode_key, encode_value

    shard = TxnShard(TxnConfig(id_expiration_ms=5_000))
    shard.init_producer_id("idle", 60_000, -1, -1, 100, T, 0)  # Empty, updated at 0
    shard.init_producer_id("busy", 60_000, -1, -1, 101, T, 0)
    shard.add_partitions("busy", 101, 0, [("a", 0)], T, 1_000)  # Ongoing until 61_000
    assert shard.next_deadline() == 5_000  # the idle id's expiry comes first
    assert not shard.tick(4_999).records
    res = shard.tick(5_000)
    assert [(k.transactional_id, v) for k, v in res.records] == [("idle", None)]
    key, value = res.records[0]
    assert decode_record(encode_key(key), encode_value(value)) == (key, None)  # a tombstone
    assert "idle" not in shard.txns and "busy" in shard.txns  # an open one never expires
    assert shard.next_deadline() == 61_000
    replayed = TxnShard(TxnConfig(id_expiration_ms=5_000))
    for record in res.records:
        replayed.replay(record)
    assert "idle" not in replayed.txns
