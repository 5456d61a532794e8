"""The classic group coordinator's pure state machine: rebalances, static membership, offsets,
errors clients react to, and that replaying its records rebuilds what it serves."""

from __future__ import annotations

import itertools

from kio.schema.errors import ErrorCode as E

from broker.coordinator.group.records import (
    GroupKey,
    OffsetKey,
    decode_record,
    encode_key,
    encode_value,
)
from broker.coordinator.group.state_machine import (
    COMPLETING,
    EMPTY,
    PREPARING,
    STABLE,
    CommitPartition,
    GroupConfig,
    GroupShard,
    JoinRequest,
    SyncRequest,
)
from broker.coordinator.placement import java_string_hash, kafka_abs, partition_for
from broker.coordinator.record_batch import encode_batch, read_records

G = "grp"


def shard(delay: int = 0) -> GroupShard:
    ids = itertools.count(1)
    return GroupShard(GroupConfig(initial_rebalance_delay_ms=delay), lambda: f"id{next(ids)}")


def join_req(member_id: str = "", instance: str | None = None, proto: bytes = b"m") -> JoinRequest:
    return JoinRequest(G, member_id, instance, 10_000, 30_000, "consumer", (("range", proto),), "c")


def answers(result) -> dict:
    return {token: resp for token, resp in result.completions}


def join_member(s: GroupShard, token: str, now: int = 0, instance: str | None = None) -> str:
    """A dynamic member's two-step join (MEMBER_ID_REQUIRED, then join with the id)."""
    if instance:
        s.join(join_req(instance=instance), token, now)
        return s.groups[G].static[instance]
    first = answers(s.join(join_req(), token, now))[token]
    assert first["error_code"] == E.member_id_required
    s.join(join_req(first["member_id"]), token, now)
    return first["member_id"]


def sync(s: GroupShard, member: str, gen: int, token: str, assignments=(), now: int = 0):
    return s.sync(
        SyncRequest(G, gen, member, None, "consumer", "range", tuple(assignments)), token, now
    )


def test_java_hash_and_placement_match_kafka():
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -(1 << 31)  # Integer.MIN_VALUE
    assert kafka_abs(-(1 << 31)) == 0 and kafka_abs(-5) == 5
    assert partition_for("polygenelubricants", 50) == 0
    assert partition_for("hello", 50) == 99162322 % 50


def test_first_member_rebalances_to_stable_and_records_replay():
    s = shard()
    m1 = join_member(s, "j1")
    g = s.groups[G]
    assert g.state == COMPLETING and g.generation == 1 and g.leader == m1
    res = sync(s, m1, 1, "s1", [(m1, b"A")])
    assert answers(res)["s1"]["assignment"] == b"A"
    assert g.state == STABLE and len(res.records) == 1
    # the group record alone rebuilds the group on another broker
    other = shard()
    for key, value in res.records:
        other.replay(decode_record(encode_key(key), encode_value(value)))
    og = other.groups[G]
    assert (og.state, og.generation, og.leader, og.members[m1].assignment) == (STABLE, 1, m1, b"A")


def test_second_member_joins_during_stable_and_both_get_new_generation():
    s = shard()
    m1 = join_member(s, "j1")
    sync(s, m1, 1, "s1", [(m1, b"A")])
    first = answers(s.join(join_req(), "j2", 5))["j2"]
    m2 = first["member_id"]
    res = s.join(join_req(m2), "j2", 5)
    assert s.groups[G].state == PREPARING and not answers(res)
    assert s.heartbeat(G, 1, m1, None, 6) == E.rebalance_in_progress
    res = s.join(join_req(m1), "j1b", 7)
    out = answers(res)
    assert out["j1b"]["generation_id"] == out["j2"]["generation_id"] == 2
    assert len(out["j1b"]["members"]) == 2 and out["j2"]["members"] == []  # leader sees all
    follower = sync(s, m2, 2, "s2")
    assert not answers(follower)  # waits for the leader
    res = sync(s, m1, 2, "s1", [(m1, b"A"), (m2, b"B")])
    assert (
        answers(res)
        == {
            "s1": answers(res)["s1"],
            "s2": answers(res)["s2"],
        }
        and answers(res)["s2"]["assignment"] == b"B"
    )


def test_errors_clients_expect():
    s = shard()
    m1 = join_member(s, "j1")
    sync(s, m1, 1, "s1", [(m1, b"A")])
    assert s.heartbeat(G, 1, "nobody", None, 1) == E.unknown_member_id
    assert s.heartbeat(G, 0, m1, None, 1) == E.illegal_generation
    assert s.heartbeat("other", 1, m1, None, 1) == E.unknown_member_id
    assert answers(sync(s, m1, 7, "x"))["x"]["error_code"] == E.illegal_generation
    bad = JoinRequest(G, "", None, 10, 30_000, "consumer", (("range", b""),))
    assert answers(s.join(bad, "b", 1))["b"]["error_code"] == E.invalid_session_timeout
    other_proto = JoinRequest(G, "", None, 10_000, 30_000, "consumer", (("zzz", b""),))
    assert answers(s.join(other_proto, "p", 1))["p"]["error_code"] == E.inconsistent_group_protocol
    _, every, _ = s.commit(G, 1, "nobody", None, [], 1)
    assert every == E.unknown_member_id
    _, every, _ = s.commit(G, 9, m1, None, [], 1)
    assert every == E.illegal_generation
    _, every, _ = s.commit("unknown", 3, "m", None, [], 1)
    assert every == E.illegal_generation
    _, per = s.delete_group(G, 1)
    assert per == E.non_empty_group
    assert s.delete_group("unknown", 1)[1] == E.group_id_not_found


def test_session_timeout_removes_member_and_rebalances():
    s = shard()
    m1 = join_member(s, "j1")
    sync(s, m1, 1, "s1", [(m1, b"A")])
    m2 = join_member(s, "j2", 1)
    s.join(join_req(m1), "j1", 1)
    sync(s, m2, 2, "s2", now=2)
    sync(s, m1, 2, "s1", [(m1, b"A"), (m2, b"B")], now=2)
    assert s.groups[G].state == STABLE
    s.heartbeat(G, 2, m1, None, 9_000)
    expired = s.tick(12_500)  # m2 silent since 2 ms: its 10 s session is over
    g = s.groups[G]
    assert m2 not in g.members and g.state == PREPARING
    assert expired.events == [
        f"group {G}: member {m2} removed (session timeout)",
        f"group {G}: preparing to rebalance in state Stable with old generation 2 "
        f"(member {m2} removed)",
    ]
    out = answers(s.join(join_req(m1), "j1", 12_600))
    assert out["j1"]["generation_id"] == 3


def test_rebalance_timeout_drops_members_that_do_not_rejoin():
    s = shard()
    m1 = join_member(s, "j1")
    sync(s, m1, 1, "s1", [(m1, b"A")])
    m2 = join_member(s, "j2", 10)  # starts a rebalance; m1 never rejoins
    assert s.groups[G].state == PREPARING
    ticked = s.tick(10 + 30_000)
    out = answers(ticked)
    assert out["j2"]["generation_id"] == 2 and list(s.groups[G].members) == [m2]
    assert any(e.startswith(f"group {G}: member {m1} removed (") for e in ticked.events)


def test_initial_rebalance_delay_waits_for_more_members():
    s = shard(delay=3000)
    m1 = join_member(s, "j1", 0)
    assert s.groups[G].state == PREPARING
    m2 = join_member(s, "j2", 100)
    assert not answers(s.tick(2000))
    out = answers(s.tick(3000))
    assert {out["j1"]["member_id"], out["j2"]["member_id"]} == {m1, m2}


def test_static_member_restart_keeps_generation_and_assignment():
    s = shard()
    a = join_member(s, "ja", instance="a")
    b = join_member(s, "jb", 1, instance="b")
    s.join(join_req(a, "a"), "ja", 1)
    sync(s, b, 2, "sb", now=2)
    sync(s, a, 2, "sa", [(a, b"A"), (b, b"B")], now=2)
    for old, inst, token in ((b, "b", "jb2"), (a, "a", "ja2")):  # follower, then the leader
        out = answers(s.join(join_req(instance=inst), token, 3))[token]
        g = s.groups[G]
        assert out["error_code"] == E.none and out["generation_id"] == 2 and g.state == STABLE
        assert out["member_id"] != old
        assert s.heartbeat(G, 2, old, inst, 4) == E.fenced_instance_id
        res = sync(s, out["member_id"], 2, "s" + token, [], 4)
        assert answers(res)["s" + token]["assignment"] == (b"B" if inst == "b" else b"A")


def test_leave_batch_and_unknown_members():
    s = shard()
    m1 = join_member(s, "j1")
    sync(s, m1, 1, "s1", [(m1, b"A")])
    res, top, per = s.leave(G, [(m1, None), ("ghost", None)], 5)
    assert top == E.none and per == [E.none, E.unknown_member_id]
    assert s.groups[G].state == EMPTY and s.groups[G].generation == 2
    assert res.records  # the empty group is written


def test_offsets_commit_fetch_delete_and_replay():
    s = shard()
    parts = [CommitPartition("t", 0, 42, 3, "meta"), CommitPartition("t", 1, 7, -1, None)]
    res, every, per = s.commit(G, -1, "", None, parts, 100)  # a simple commit
    assert every is None and per == [E.none, E.none] and len(res.records) == 2
    big = [CommitPartition("t", 2, 1, -1, "x" * 5000)]
    assert s.commit(G, -1, "", None, big, 100)[2] == [E.offset_metadata_too_large]
    fetched = dict(s.fetch_offsets(G, [("t", [0, 1, 9])]))["t"]
    assert [(p, v.offset if v else -1) for p, v in fetched] == [(0, 42), (1, 7), (9, -1)]
    assert [t for t, _ in s.fetch_offsets(G, None)] == ["t"]
    # replay from the log bytes on a fresh shard
    batch = encode_batch([(encode_key(k), encode_value(v)) for k, v in res.records], 100)
    fresh = shard()
    for _, key, value in read_records(batch):
        fresh.replay(decode_record(key, value))
    assert fresh.groups[G].offsets[("t", 0)].offset == 42
    res, code = s.delete_group(G, 200)
    assert code == E.none and res.records[-1] == (GroupKey(G), None)
    assert (OffsetKey(G, "t", 0), None) in res.records and G not in s.groups


def test_offset_delete_refuses_subscribed_topics():
    s = shard()
    sub = b"\x00\x00" + b"\x00\x00\x00\x01" + b"\x00\x01t"  # ConsumerProtocolSubscription v0 [t]
    s.join(JoinRequest(G, "", "i", 10_000, 30_000, "consumer", (("range", sub),)), "j", 0)
    m = s.groups[G].static["i"]
    sync(s, m, 1, "s", [(m, b"")])
    s.commit(
        G, 1, m, "i", [CommitPartition("t", 0, 5, -1, ""), CommitPartition("u", 0, 5, -1, "")], 1
    )
    _, top, rows = s.delete_offsets(G, [("t", [0]), ("u", [0])], 2)
    assert top == E.none and rows == [
        ("t", [(0, E.group_subscribed_to_topic)]),
        ("u", [(0, E.none)]),
    ]
    assert ("u", 0) not in s.groups[G].offsets and ("t", 0) in s.groups[G].offsets


def test_offsets_of_empty_groups_expire():
    s = GroupShard(GroupConfig(offsets_retention_ms=1000))
    s.commit(G, -1, "", None, [CommitPartition("t", 0, 1, -1, "")], 0)
    assert not s.expire_offsets(500).records
    res = s.expire_offsets(2000)
    assert (OffsetKey(G, "t", 0), None) in res.records and G not in s.groups


def test_offsets_expire_only_after_the_group_has_been_empty_that_long():
    s = GroupShard(GroupConfig(offsets_retention_ms=1000, initial_rebalance_delay_ms=0))
    first = answers(s.join(join_req(), "j", 0))["j"]["member_id"]
    s.join(join_req(first), "j", 0)
    sync(s, first, 1, "s", [(first, b"")])
    s.commit(G, 1, first, None, [CommitPartition("t", 0, 1, -1, "")], 0)
    s.leave(G, [(first, None)], 5000)  # Empty from 5000 on
    assert not s.expire_offsets(5500).records  # the commit is old, the emptiness is not
    res = s.expire_offsets(6001)
    assert (OffsetKey(G, "t", 0), None) in res.records and G not in s.groups
