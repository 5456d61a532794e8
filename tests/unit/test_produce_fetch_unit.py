"""Data-plane logic without processes: offset assignment and follower appends, leader-epoch
lookups and truncation points, high-watermark advance and ISR decisions, HW checkpoints across
reopen, and the hand-written wire codecs checked against kio's encoders and decoders."""

from __future__ import annotations

import io
import struct

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from broker.protocol.data_codec import (
    EpochRequest,
    FetchPartition,
    FetchPartitionResult,
    FetchRequest,
    PartitionProduceResult,
    read_fetch,
    read_fetch_response,
    read_list_offsets,
    read_offset_for_leader_epoch,
    read_offset_for_leader_epoch_response,
    read_produce,
    write_fetch_request,
    write_fetch_response,
    write_list_offsets_response,
    write_offset_for_leader_epoch_request,
    write_offset_for_leader_epoch_response,
    write_produce_response,
)
from broker.protocol.kafka_codec import Reader
from broker.replica.isr_tracker import FollowerState, high_watermark, may_join, out_of_sync
from broker.replica.partition import Partition
from broker.replica.partition_log import InvalidBatchError, LeaderAppend, PartitionLog
from broker.replica.replica_fetcher import truncation_offset
from tests.unit.test_partition_log import make_batch, values_in

# ---- partition log: leader and follower appends -------------------------------------------------


def test_leader_append_rewrites_offsets_and_epoch_outside_the_crc(tmp_path):
    plog = PartitionLog.open(tmp_path / "t-0")
    batch = make_batch([b"a", b"b", b"c"])
    assert plog.append(batch, leader_epoch=4) == (0, 2)
    assert plog.append(batch, leader_epoch=4) == (3, 5)
    data = plog.read(0)
    assert struct.unpack_from(">qi", data, 0)[0] == 0
    second = len(batch)
    assert struct.unpack_from(">q", data, second)[0] == 3
    assert struct.unpack_from(">i", data, second + 12)[0] == 4  # partition leader epoch
    assert data[second + 17 :] == batch[17:]  # CRC and everything it covers unchanged
    assert values_in(data) == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"a"), (4, b"b"), (5, b"c")]


def test_read_stops_below_max_offset(tmp_path):
    plog = PartitionLog.open(tmp_path / "t-0")
    plog.append(make_batch([b"a", b"b"]), 0)
    plog.append(make_batch([b"c"]), 0)
    assert [o for o, _ in values_in(plog.read(0, max_offset=2))] == [0, 1]
    assert plog.read(0, max_offset=1) == b""  # only whole batches below the limit
    assert plog.read(2, max_offset=2) == b""


def test_follower_append_keeps_leader_offsets_and_epochs(tmp_path):
    leader = PartitionLog.open(tmp_path / "l")
    leader.append(make_batch([b"a", b"b"]), 1)
    leader.append(make_batch([b"c"]), 3)
    follower = PartitionLog.open(tmp_path / "f")
    assert follower.append_as_follower(leader.read(0)) == 3
    assert follower.epochs == [(1, 0), (3, 2)]
    assert follower.read(0) == leader.read(0)
    assert follower.append_as_follower(leader.read(0)) == 3  # already there: skipped
    leader.append(make_batch([b"d"]), 3)
    tail = leader.read(3)
    with pytest.raises(InvalidBatchError):
        PartitionLog.open(tmp_path / "gap").append_as_follower(tail)  # would leave a gap
    bad = bytearray(tail)
    bad[-1] ^= 1
    with pytest.raises(InvalidBatchError):
        follower.append_as_follower(bytes(bad))
    assert follower.log_end_offset == 3


def test_end_offset_for_epoch_and_epoch_for_offset(tmp_path):
    plog = PartitionLog.open(tmp_path / "t-0")
    plog.append(make_batch([b"a", b"b"]), 1)  # epoch 1: 0-1
    plog.append(make_batch([b"c"]), 3)  # epoch 3: 2
    plog.append(make_batch([b"d", b"e"]), 5)  # epoch 5: 3-4
    assert plog.end_offset_for_epoch(5) == (5, 5)
    assert plog.end_offset_for_epoch(4) == (3, 3)
    assert plog.end_offset_for_epoch(1) == (1, 2)
    assert plog.end_offset_for_epoch(0) == (0, 0)
    assert plog.end_offset_for_epoch(6) == (-1, -1)
    assert [plog.epoch_for_offset(o) for o in range(5)] == [1, 1, 3, 5, 5]


def test_truncation_points(tmp_path):
    # the follower wrote offsets 2-4 in epoch 2 as a leader that never committed them; the new
    # leader moved from epoch 1 straight to epoch 3 at offset 2
    follower = PartitionLog.open(tmp_path / "f")
    follower.append(make_batch([b"a", b"b"]), 1)
    follower.append(make_batch([b"x", b"y", b"z"]), 2)
    follower.set_high_watermark(2)
    assert truncation_offset(follower, 1, 2) == 2  # leader: "epoch 1 ends at 2"
    assert truncation_offset(follower, 2, 4) == 4  # same epoch, leader has less
    assert truncation_offset(follower, 2, 9) == 5  # never beyond our own end
    assert truncation_offset(follower, -1, -1) == 2  # unknown: the high watermark
    follower.truncate_to(truncation_offset(follower, 1, 2))
    assert follower.log_end_offset == 2 and follower.epochs == [(1, 0)]


def test_high_watermark_checkpoint_survives_reopen(tmp_path):
    plog = PartitionLog.open(tmp_path / "t-0")
    plog.append(make_batch([b"a", b"b", b"c"]), 0)
    plog.advance_high_watermark(2)
    plog.checkpoint_high_watermark()
    plog.advance_high_watermark(3)  # not yet checkpointed: a crash resumes lower, never higher
    assert PartitionLog.open(tmp_path / "t-0").high_watermark == 2
    plog.close()  # close checkpoints
    assert PartitionLog.open(tmp_path / "t-0").high_watermark == 3


# ---- leader bookkeeping ---------------------------------------------------------------------------


def test_follower_caught_up_rules():
    f = FollowerState()
    f.on_fetch(5, 10, now_ms=1000)  # behind, no earlier fetch
    assert f.last_caught_up_ms == 0 and f.log_end_offset == 5
    f.on_fetch(10, 12, now_ms=2000)  # reached the leader's end as of the previous fetch
    assert f.last_caught_up_ms == 1000
    f.on_fetch(12, 12, now_ms=3000)  # fully caught up now
    assert f.last_caught_up_ms == 3000


def test_high_watermark_is_min_isr_leo_and_never_goes_down():
    fs = {2: FollowerState(log_end_offset=7), 3: FollowerState(log_end_offset=9)}
    assert high_watermark(1, 10, (1, 2, 3), fs, 0) == 7
    assert high_watermark(1, 10, (1, 3), fs, 0) == 9  # 2 left the ISR
    assert high_watermark(1, 10, (1,), fs, 0) == 10
    assert high_watermark(1, 10, (1, 2, 3), fs, 8) == 8  # never below the current HW
    fs[2] = FollowerState()  # position unknown (new epoch)
    assert high_watermark(1, 10, (1, 2, 3), fs, 4) == 4


def test_out_of_sync_and_may_join():
    fs = {
        2: FollowerState(log_end_offset=10, last_caught_up_ms=0),
        3: FollowerState(log_end_offset=4, last_caught_up_ms=0),
    }
    assert out_of_sync(1, 10, (1, 2, 3), fs, now_ms=31_000, lag_ms=30_000) == [3]  # 2 is at the end
    assert out_of_sync(1, 10, (1, 2, 3), fs, now_ms=29_000, lag_ms=30_000) == []
    assert may_join(FollowerState(log_end_offset=8), high_watermark_=8, epoch_start_offset=6)
    assert not may_join(FollowerState(log_end_offset=7), high_watermark_=8, epoch_start_offset=6)
    assert not may_join(FollowerState(log_end_offset=8), high_watermark_=8, epoch_start_offset=9)
    assert not may_join(FollowerState(), high_watermark_=0, epoch_start_offset=0)


def test_partition_leader_advances_hw_from_follower_fetches(tmp_path):
    part = Partition(
        "t",
        "tid",
        0,
        PartitionLog.open(tmp_path / "t-0"),
        role="leader",
        leader=1,
        leader_epoch=0,
        partition_epoch=0,
        isr=(1, 2),
        replicas=(1, 2, 3),
    )
    part.log.assign_epoch(0, 0)
    part.reset_followers(1, now_ms=0)
    assert part.append_as_leader(make_batch([b"a", b"b"])) == LeaderAppend(0, 1)
    assert part.high_watermark == 0  # follower 2's position is unknown
    assert not part.on_follower_fetch(2, 2, now_ms=10)  # in the ISR already
    assert part.high_watermark == 2
    assert part.on_follower_fetch(3, 2, now_ms=10)  # outside the ISR, caught up: may join
    assert not part.on_follower_fetch(9, 2, now_ms=10)  # not a replica
    part.adopt_isr((1, 2, 3), 1)
    assert part.isr == (1, 2, 3) and part.partition_epoch == 1


# ---- wire codecs against kio ----------------------------------------------------------------------


def kio_encode(entity) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


def kio_decode(api_key: int, version: int, data: bytes, request: bool = False):
    cls = (load_request_schema if request else load_response_schema)(api_key, version)
    entity, size = entity_reader(cls)(data, 0)
    assert size == len(data)
    return entity


def _request(api_key: int, version: int, **values):
    from broker.protocol.kafka_codec import build

    return build(load_request_schema(api_key, version), values)


@pytest.mark.parametrize("version", [3, 7, 8, 9])
def test_produce_request_and_response(version):
    records = make_batch([b"v"])
    req = _request(
        0,
        version,
        transactional_id=None,
        acks=-1,
        timeout=__import__("datetime").timedelta(seconds=5),
        topic_data=[{"name": "orders", "partition_data": [{"index": 2, "records": records}]}],
    )
    got = read_produce(version, Reader(kio_encode(req)))
    assert (got.acks, got.timeout_ms, got.topics) == (-1, 5000, [("orders", [(2, records)])])
    body = write_produce_response(version, [("orders", [PartitionProduceResult(2, 0, 41, 0)])])
    resp = kio_decode(0, version, body)
    p = resp.responses[0].partition_responses[0]
    assert (resp.responses[0].name, p.index, p.error_code.value, p.base_offset) == (
        "orders",
        2,
        0,
        41,
    )


@pytest.mark.parametrize("version", [4, 9, 11, 12])
def test_fetch_request_and_response(version):
    import datetime

    part = {
        "partition": 1,
        "current_leader_epoch": 3,
        "fetch_offset": 17,
        "log_start_offset": 0,
        "partition_max_bytes": 1 << 20,
    }
    req = _request(
        1,
        version,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=500),
        min_bytes=1,
        max_bytes=1 << 24,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[{"topic": "orders", "partitions": [part]}],
        forgotten_topics_data=[],
        rack_id="",
    )
    got = read_fetch(version, Reader(kio_encode(req)))
    fp = got.topics[0][1][0]
    assert (got.max_wait_ms, got.topics[0][0], fp.partition, fp.fetch_offset) == (
        500,
        "orders",
        1,
        17,
    )
    assert fp.current_leader_epoch == (3 if version >= 9 else -1)
    records = make_batch([b"x", b"y"])
    body = write_fetch_response(
        version, 0, [("orders", [FetchPartitionResult(1, 0, 20, 20, 0, records)])]
    )
    resp = kio_decode(1, version, body)
    p = resp.responses[0].partitions[0]
    assert (p.partition_index, p.high_watermark, p.last_stable_offset) == (1, 20, 20)


def test_follower_fetch_request_and_response_round_trip():
    req = FetchRequest(
        102, 500, 1, 1 << 24, 0, [("orders", [FetchPartition(0, 4, 99, 0, 1 << 20)])]
    )
    decoded = kio_decode(1, 11, write_fetch_request(req), request=True)
    assert (decoded.replica_id, decoded.topics[0].partitions[0].fetch_offset) == (102, 99)
    assert read_fetch(11, Reader(write_fetch_request(req))).topics == req.topics
    records = make_batch([b"z"])
    body = write_fetch_response(
        11, 0, [("orders", [FetchPartitionResult(0, 0, 100, 100, 0, records)])]
    )
    error, results = read_fetch_response(11, Reader(body))
    assert (
        error == 0
        and results[0][1][0].records == records
        and results[0][1][0].high_watermark == 100
    )


@pytest.mark.parametrize("version", [2, 3, 4])
def test_offset_for_leader_epoch_codec(version):
    req = _request(
        23,
        version,
        replica_id=-1,
        topics=[
            {
                "topic": "orders",
                "partitions": [{"partition": 0, "current_leader_epoch": 5, "leader_epoch": 3}],
            }
        ],
    )
    assert read_offset_for_leader_epoch(version, Reader(kio_encode(req))).topics == [
        ("orders", [(0, 5, 3)])
    ]
    body = write_offset_for_leader_epoch_response(version, [("orders", [(0, 0, 3, 42)])])
    p = kio_decode(23, version, body).topics[0].partitions[0]
    assert (p.partition, p.leader_epoch, p.end_offset) == (0, 3, 42)
    if version == 3:
        ours = write_offset_for_leader_epoch_request(EpochRequest(7, [("orders", [(0, 5, 3)])]))
        assert kio_decode(23, 3, ours, request=True).replica_id == 7
        assert read_offset_for_leader_epoch_response(Reader(body)) == [("orders", [(0, 0, 3, 42)])]


@pytest.mark.parametrize("version", [1, 4, 6, 7])
def test_list_offsets_codec(version):
    req = _request(
        2,
        version,
        replica_id=-1,
        isolation_level=0,
        topics=[
            {
                "name": "orders",
                "partitions": [{"partition_index": 2, "current_leader_epoch": 1, "timestamp": -2}],
            }
        ],
    )
    got = read_list_offsets(version, Reader(kio_encode(req)))
    assert got.topics == [("orders", [(2, 1 if version >= 4 else -1, -2)])]
    body = write_list_offsets_response(version, [("orders", [(2, 0, -1, 7, 1)])])
    p = kio_decode(2, version, body).topics[0].partitions[0]
    assert (p.partition_index, p.offset) == (2, 7)
