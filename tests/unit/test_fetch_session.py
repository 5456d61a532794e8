"""Incremental fetch sessions (KIP-227): the leader's session cache, the follower's request
builder, the two against each other, and the session fields of the Fetch codec (against kio)."""

from __future__ import annotations

import random

import pytest
from kio.index import load_request_schema

from broker.protocol.data_codec import (
    FetchPartition,
    FetchPartitionResult,
    FetchRequest,
    read_fetch,
    read_fetch_session_response,
    write_fetch_request,
    write_fetch_response,
)
from broker.protocol.fetch_session import FetchSessionCache, next_epoch
from broker.protocol.kafka_codec import Reader, build
from broker.replica.fetch_session_builder import FetchSessionBuilder
from tests.unit.test_produce_fetch_unit import kio_decode, kio_encode

NOT_FOUND, BAD_EPOCH = 70, 71


def fp(pid: int, offset: int, epoch: int = 1) -> FetchPartition:
    return FetchPartition(pid, epoch, offset, 0, 1 << 20)


def req(
    topics, session_id=0, epoch=0, forgotten=(), replica_id=2
) -> FetchRequest:  # a follower's fetch unless replica_id < 0
    return FetchRequest(
        replica_id, 500, 1, 1 << 24, 0, list(topics), session_id, epoch, list(forgotten)
    )


def res(pid: int, hw: int, records: bytes = b"", error: int = 0) -> FetchPartitionResult:
    return FetchPartitionResult(pid, error, hw, hw, 0, records)


def open_session(cache: FetchSessionCache, parts, now=0.0, replica_id=2) -> int:
    ctx = cache.context(req([("t", [fp(p, 0) for p in parts])], replica_id=replica_id), now)
    err, sid, out = ctx.respond([("t", [res(p, 5) for p in parts])], now)
    assert err == 0 and len(out[0][1]) == len(parts)
    return sid


def test_full_fetch_opens_a_session_and_incremental_answers_only_news():
    cache = FetchSessionCache(rng=random.Random(1))
    sid = open_session(cache, [0, 1, 2])
    assert sid > 0 and cache.sessions[sid].epoch == 1
    # nothing sent: every session partition is read, from its cached fetch offset
    ctx = cache.context(req([], sid, 1), 1.0)
    assert [(n, [p.partition for p in ps]) for n, ps in ctx.topics] == [("t", [0, 1, 2])]
    err, got, out = ctx.respond([("t", [res(0, 5), res(1, 6), res(2, 5, b"rec")])], 1.0)
    assert (err, got) == (0, sid)
    assert [p.partition for p in out[0][1]] == [1, 2]  # 1: hw moved, 2: records; 0: nothing
    # partition 1 moves its fetch offset; the others keep theirs
    ctx = cache.context(req([("t", [fp(1, 6)])], sid, 2), 2.0)
    offsets = {p.partition: p.fetch_offset for p in ctx.topics[0][1]}
    assert offsets == {0: 0, 1: 6, 2: 0}
    err, _, out = ctx.respond([("t", [res(0, 5), res(1, 6), res(2, 5)])], 2.0)
    assert out == []  # nothing new anywhere: an empty answer, the session goes on
    assert cache.sessions[sid].epoch == 3


def test_errors_are_always_answered_and_forgotten_partitions_leave():
    cache = FetchSessionCache()
    sid = open_session(cache, [0, 1])
    ctx = cache.context(req([], sid, 1, forgotten=[("t", [0])]), 1.0)
    assert [p.partition for p in ctx.topics[0][1]] == [1]
    err, _, out = ctx.respond([("t", [res(1, -1, error=6)])], 1.0)
    assert out[0][1][0].error_code == 6
    ctx = cache.context(req([], sid, 2), 2.0)
    _, _, out = ctx.respond([("t", [res(1, -1, error=6)])], 2.0)
    assert out[0][1][0].error_code == 6  # an error again: answered again
    ctx = cache.context(req([("u", [fp(0, 0)])], sid, 3), 3.0)  # a new partition joins
    assert [n for n, _ in ctx.topics] == ["t", "u"]
    _, _, out = ctx.respond([("t", [res(1, 5)]), ("u", [res(0, 0)])], 3.0)
    assert [n for n, _ in out] == ["t", "u"]  # first answers of both are news


def test_unknown_session_and_wrong_epoch_are_errors_that_change_nothing():
    cache = FetchSessionCache()
    sid = open_session(cache, [0])
    ctx = cache.context(req([("t", [fp(0, 9)])], sid + 1, 1), 1.0)
    assert ctx.respond([], 1.0) == (NOT_FOUND, 0, [])
    ctx = cache.context(req([("t", [fp(0, 9)])], sid, 5), 1.0)
    assert ctx.respond([], 1.0) == (BAD_EPOCH, 0, [])
    s = cache.sessions[sid]
    assert s.epoch == 1 and s.partitions[("t", 0)].request.fetch_offset == 0


def test_full_fetch_with_a_session_id_closes_it_and_final_epoch_is_sessionless():
    cache = FetchSessionCache()
    sid = open_session(cache, [0])
    ctx = cache.context(req([("t", [fp(0, 3)])], sid, -1), 1.0)
    assert ctx.respond([("t", [res(0, 5)])], 1.0)[:2] == (0, 0)
    assert sid not in cache.sessions
    old = open_session(cache, [0])
    ctx = cache.context(req([("t", [fp(0, 3)])], old, 0), 2.0)
    _, new, _ = ctx.respond([("t", [res(0, 5)])], 2.0)
    assert new not in (0, old) and list(cache.sessions) == [new]


def test_epoch_wraps_to_one():
    assert next_epoch(0x7FFFFFFF) == 1 and next_epoch(0) == 1 and next_epoch(6) == 7


def test_cache_eviction_prefers_stale_then_least_valuable():
    cache = FetchSessionCache(max_slots=2, eviction_ms=1000)
    consumer = open_session(cache, [0], now=0.0, replica_id=-1)
    follower = open_session(cache, [0, 1], now=10.0)
    # full: a consumer with one partition is worth no more than the one cached: no session
    assert open_session(cache, [0], now=20.0, replica_id=-1) == 0
    # a follower is worth more than a consumer: the consumer's session goes
    newer = open_session(cache, [0], now=30.0)
    assert set(cache.sessions) == {follower, newer} and cache.evictions == 1
    assert cache.context(req([], consumer, 1), 40.0).respond([], 40.0)[0] == NOT_FOUND
    # idle longer than eviction_ms: evictable by anyone
    late = open_session(cache, [0], now=1015.0, replica_id=-1)
    assert late in cache.sessions and follower not in cache.sessions


def test_no_slots_means_sessionless():
    cache = FetchSessionCache(max_slots=0)
    assert open_session(cache, [0]) == 0 and cache.sessions == {}


def test_builder_full_then_incremental_and_fallback_on_errors():
    b = FetchSessionBuilder()
    wanted = {("t", 0): fp(0, 10), ("t", 1): fp(1, 20)}
    r1 = b.build(wanted)
    assert r1.full and (r1.session_id, r1.epoch) == (0, 0) and len(r1.topics[0][1]) == 2
    b.on_response(0, 77)
    r2 = b.build({("t", 0): fp(0, 11), ("t", 1): fp(1, 20)})
    assert (r2.session_id, r2.epoch, r2.forgotten) == (77, 1, [])
    assert [p.partition for p in r2.topics[0][1]] == [0]  # only the offset that moved
    b.on_response(0, 77)
    r3 = b.build({("t", 0): fp(0, 11)})
    assert (r3.epoch, r3.topics, r3.forgotten) == (2, [], [("t", [1])])
    b.on_response(NOT_FOUND, 0)
    r4 = b.build({("t", 0): fp(0, 11)})
    assert r4.full and r4.session_id == 77  # a full fetch that also closes the old session
    b.on_response(0, 0)  # no slot on the leader: full fetches go on
    assert b.build({("t", 0): fp(0, 11)}).full


def test_builder_starts_over_on_an_unexpected_session_id():
    b = FetchSessionBuilder()
    b.build({("t", 0): fp(0, 1)})
    b.on_response(0, 5)
    b.build({("t", 0): fp(0, 1)})
    b.on_response(0, 6)
    assert b.build({("t", 0): fp(0, 1)}).full


def test_builder_against_the_cache_keeps_the_leaders_view_exact():
    """Random partition moves and set changes: the leader always reads what the follower
    would have sent in a full fetch."""
    rnd = random.Random(7)
    cache, b = FetchSessionCache(), FetchSessionBuilder()
    offsets = {("t", p): 0 for p in range(6)}
    for step in range(200):
        for k in offsets:
            if rnd.random() < 0.3:
                offsets[k] += 1
        wanted = {k: fp(k[1], o) for k, o in offsets.items() if rnd.random() < 0.9}
        s = b.build(wanted)
        r = req(s.topics, s.session_id, s.epoch, s.forgotten)
        ctx = cache.context(r, float(step))
        read = {(n, p.partition): p for n, ps in ctx.topics for p in ps}
        assert read == wanted or (ctx.error == NOT_FOUND and step == 101)
        err, sid, _ = ctx.respond(
            [(n, [res(p.partition, step) for p in ps]) for n, ps in ctx.topics], float(step)
        )
        b.on_response(err, sid)
        if step == 100:
            cache.sessions.clear()  # the leader restarted: 70, then a full fetch
    assert b.incremental_fetches > 150


@pytest.mark.parametrize("version", [7, 11, 12])
def test_session_fields_and_forgotten_topics_decode(version):
    import datetime

    body = kio_encode(
        build(
            load_request_schema(1, version),
            {
                "replica_id": -1,
                "max_wait": datetime.timedelta(milliseconds=100),
                "min_bytes": 1,
                "max_bytes": 1 << 20,
                "isolation_level": 0,
                "session_id": 42,
                "session_epoch": 3,
                "topics": [],
                "forgotten_topics_data": [{"topic": "t", "partitions": [1, 4]}],
                "rack_id": "",
            },
        )
    )
    got = read_fetch(version, Reader(body))
    assert (got.session_id, got.session_epoch, got.forgotten) == (42, 3, [("t", [1, 4])])


def test_follower_session_request_and_response_round_trip():
    r = req([("t", [fp(0, 9)])], 42, 3, forgotten=[("u", [2])])
    decoded = kio_decode(1, 11, write_fetch_request(r), request=True)
    assert (decoded.session_id, decoded.session_epoch) == (42, 3)
    assert decoded.forgotten_topics_data[0].partitions == (2,)
    assert read_fetch(11, Reader(write_fetch_request(r))).forgotten == [("u", [2])]
    body = write_fetch_response(11, 0, [], 42)
    assert kio_decode(1, 11, body).session_id == 42
    assert read_fetch_session_response(11, Reader(body)) == (0, 42, [])
