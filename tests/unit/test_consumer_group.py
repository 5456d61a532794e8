"""Consumer-protocol (KIP-848) groups: the pure state machine (epochs, incremental reassignment,
leaving, fencing), its records (Kafka's bytes, replay rebuilds the state), the assignors, and
how classic and consumer groups keep out of each other's way."""

from __future__ import annotations

import itertools
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode as E

from broker.coordinator.group.assignors import parse_assignors, range_assignor, uniform
from broker.coordinator.group.consumer_group import (
    ASSIGNING,
    EMPTY,
    M_UNRELEASED,
    M_UNREVOKED,
    RECONCILING,
    STABLE,
    ConsumerGroupConfig,
    HeartbeatRequest,
    consumer_group_config,
)
from broker.coordinator.group.consumer_records import (
    CGCurrentAssignmentKey,
    CGCurrentAssignmentValue,
    CGMemberKey,
    CGMemberValue,
    CGPartitionMetadataKey,
    CGPartitionMetadataValue,
    TopicMetadata,
    decode_any,
    encode_any,
)
from broker.coordinator.group.records import GroupKey, OffsetKey, OffsetValue, RecordFormatError
from broker.coordinator.group.shard import CoordinatorShard
from broker.coordinator.group.state_machine import CommitPartition, JoinRequest
from kraft.config import ConfigError
from tests.unit.broker_properties import MINIMAL_BROKER

G = "cg"
T1 = uuid.UUID(int=1)
T2 = uuid.UUID(int=2)
TOPICS = {"t": (T1, 6), "u": (T2, 2)}


def shard(**cfg) -> CoordinatorShard:
    ids = itertools.count(1)
    return CoordinatorShard(None, ConsumerGroupConfig(**cfg), lambda: f"id{next(ids)}")


def hb(
    s: CoordinatorShard,
    member: str,
    epoch: int,
    owned=(),
    topics=("t",),
    now: int = 0,
    assignor: str | None = None,
    view=TOPICS,
) -> dict:
    req = HeartbeatRequest(
        G,
        member,
        epoch,
        rebalance_timeout_ms=30_000 if epoch == 0 else -1,
        topics=tuple(topics) if epoch == 0 else None,
        server_assignor=assignor,
        owned=tuple((t, tuple(ps)) for t, ps in owned) if owned is not None else None,
        client_id="c",
    )
    result = s.consumer_heartbeat(req, view, "tok", now)
    s.last_records = result.records  # type: ignore[attr-defined]  # for assertions
    [(token, resp)] = result.completions
    return resp


def parts(resp: dict) -> set[int]:
    return {p for _, ps in resp["assignment"] or () for p in ps}


def owned(s: CoordinatorShard, member: str):
    m = s.consumer.groups[G].members[member]
    return [(t, sorted(ps)) for t, ps in m.assigned.items()]


def test_first_member_gets_everything_then_a_second_joins_incrementally():
    s = shard()
    a = hb(s, "A", 0)
    assert a["error_code"] == E.none and a["member_epoch"] == 1
    assert parts(a) == set(range(6))
    assert s.consumer.groups[G].state == STABLE
    b = hb(s, "B", 0)
    assert b["member_epoch"] == 2 and parts(b) == set()  # A still owns them: unreleased
    g = s.consumer.groups[G]
    assert g.members["B"].state == M_UNRELEASED and g.state == RECONCILING
    # A's next heartbeat: it must revoke half (stays in epoch 1 until it does)
    a = hb(s, "A", 1, owned=owned(s, "A"))
    assert a["member_epoch"] == 1 and len(parts(a)) == 3
    assert g.members["A"].state == M_UNREVOKED
    # while A still reports owning them, B gets nothing
    assert hb(s, "B", 2, owned=[])["assignment"] is None
    assert not g.members["B"].assigned
    # A revoked: it moves to epoch 2; B then gets the released partitions
    a = hb(s, "A", 1, owned=owned(s, "A"))
    assert a["member_epoch"] == 2 and g.members["A"].state == 0
    b = hb(s, "B", 2, owned=[])
    mine = {p for _, ps in owned(s, "A") for p in ps}
    assert len(parts(b)) == 3 and mine | parts(b) == set(range(6))
    assert g.state == STABLE


def test_leave_gives_partitions_back_and_bumps_the_epoch():
    s = shard()
    hb(s, "A", 0)
    hb(s, "B", 0)
    hb(s, "A", 1, owned=owned(s, "A"))
    hb(s, "A", 1, owned=owned(s, "A"))
    hb(s, "B", 2, owned=[])
    g = s.consumer.groups[G]
    left = hb(s, "B", -1, owned=None)
    assert left["error_code"] == E.none and left["member_epoch"] == -1
    assert set(g.members) == {"A"} and g.epoch == 3 and g.state == ASSIGNING
    a = hb(s, "A", 2, owned=owned(s, "A"))
    assert a["member_epoch"] == 3 and parts(a) == set(range(6))
    assert hb(s, "B", 2)["error_code"] == E.unknown_member_id


def test_epoch_errors_and_validation():
    s = shard()
    hb(s, "A", 0)
    assert hb(s, "A", 5, owned=[])["error_code"] == E.fenced_member_epoch
    assert hb(s, "Z", 1)["error_code"] == E.unknown_member_id
    assert hb(s, "A", -7)["error_code"] == E.invalid_request
    bad = HeartbeatRequest(G, "X", 0, rebalance_timeout_ms=1, topics=("t",), owned=(), client_id="")
    assert s.consumer_heartbeat(bad, TOPICS, 1, 0).completions[0][1]["error_code"] == E.none
    unknown = hb(s, "Y", 0, assignor="sticky")
    assert unknown["error_code"] == E.unsupported_assignor
    assert "uniform, range" in unknown["error_message"]
    empty = HeartbeatRequest("", "X", 0, rebalance_timeout_ms=1, topics=("t",), owned=())
    assert s.consumer_heartbeat(empty, TOPICS, 1, 0).completions[0][1]["error_code"] == (
        E.invalid_request
    )
    other = HeartbeatRequest("nope", "X", 3)
    assert s.consumer_heartbeat(other, TOPICS, 1, 0).completions[0][1]["error_code"] == (
        E.group_id_not_found
    )


def test_session_expiry_fences_the_member():
    s = shard(session_timeout_ms=1000)
    hb(s, "A", 0, now=0)
    hb(s, "B", 0, now=500)
    assert s.next_deadline() == 1000
    out = s.tick(1000)
    assert any(isinstance(k, CGMemberKey) and v is None for k, v in out.records)
    assert set(s.consumer.groups[G].members) == {"B"}


def test_stuck_revocation_is_fenced_after_the_rebalance_timeout():
    s = shard(session_timeout_ms=100_000)
    hb(s, "A", 0)
    hb(s, "B", 0)
    hb(s, "A", 1, owned=owned(s, "A"))  # told to revoke at t=0, rebalance timeout 30 s
    assert s.consumer.groups[G].members["A"].state == M_UNREVOKED
    s.tick(29_999)
    assert "A" in s.consumer.groups[G].members
    s.tick(30_000)
    assert "A" not in s.consumer.groups[G].members


def test_replay_rebuilds_the_same_groups():
    s = shard()
    records = []
    hb(s, "A", 0)
    records += s.last_records
    hb(s, "B", 0)
    records += s.last_records
    hb(s, "A", 1, owned=owned(s, "A"))
    records += s.last_records
    r = shard()
    for rec in records:
        k, v = encode_any(rec)
        r.replay(decode_any(k, v))
    a, b = s.consumer.groups[G], r.consumer.groups[G]
    assert (a.epoch, a.assignment_epoch, a.topics, a.target, a.owners) == (
        b.epoch,
        b.assignment_epoch,
        b.topics,
        b.target,
        b.owners,
    )
    for mid, m in a.members.items():
        assert m.current() == b.members[mid].current() and m.meta == b.members[mid].meta


def test_record_bytes_match_kafkas_layout():
    k, v = encode_any(
        (CGMemberKey("g", "m"), CGMemberValue(None, None, "c", "h", ("t",), None, 5, "range"))
    )
    assert k == b"\x00\x05\x00\x01g\x00\x01m"
    # version 0; null instance, null rack; compact "c", "h"; one topic "t"; null regex;
    # rebalance timeout 5; compact "range"; no tagged fields
    assert v == b"\x00\x00\x00\x00\x02c\x02h\x02\x02t\x00\x00\x00\x00\x05\x06range\x00"
    k, v = encode_any(
        (CGCurrentAssignmentKey("g", "m"), CGCurrentAssignmentValue(3, 2, 0, ((T1, (0, 1)),), ()))
    )
    assert k[:2] == b"\x00\x08"
    assert v == (
        b"\x00\x00" + b"\x00\x00\x00\x03\x00\x00\x00\x02\x00"
        + b"\x02" + T1.bytes + b"\x03\x00\x00\x00\x00\x00\x00\x00\x01\x00"
        + b"\x01" + b"\x00"
    )  # fmt: skip
    meta = CGPartitionMetadataValue((TopicMetadata(T1, "t", 6),))
    assert decode_any(*encode_any((CGPartitionMetadataKey("g"), meta))) == (
        CGPartitionMetadataKey("g"),
        meta,
    )
    assert decode_any(k, None) == (CGCurrentAssignmentKey("g", "m"), None)


def test_uniform_is_balanced_and_sticky():
    members = {m: frozenset({"t", "u"}) for m in ("a", "b", "c")}
    first = uniform(members, TOPICS, {})
    counts = sorted(sum(len(ps) for ps in first[m].values()) for m in members)
    assert counts == [2, 3, 3]
    more = dict(members, d=frozenset({"t", "u"}))
    second = uniform(more, TOPICS, first)
    counts = sorted(sum(len(ps) for ps in second[m].values()) for m in more)
    assert counts == [2, 2, 2, 2]
    moved = sum(len(ps - second[m].get(t, set())) for m in members for t, ps in first[m].items())
    assert moved == 2  # only what d needs moves


def test_uniform_respects_different_subscriptions():
    members = {"a": frozenset({"t"}), "b": frozenset({"t", "u"})}
    out = uniform(members, TOPICS, {})
    assert T2 not in out["a"] and out["b"][T2] == {0, 1}
    assert len(out["a"][T1]) == 4 and len(out["b"][T1]) == 2


def test_range_gives_contiguous_ranges_in_member_order():
    members = {"b": frozenset({"t"}), "a": frozenset({"t"}), "c": frozenset({"t"})}
    out = range_assignor(members, {"t": (T1, 7)}, {})
    assert out["a"][T1] == {0, 1, 2} and out["b"][T1] == {3, 4} and out["c"][T1] == {5, 6}


def test_assignor_choice_and_config():
    s = shard(assignors=("uniform", "range"))
    hb(s, "A", 0, assignor="range")
    assert s.consumer.assignor_of(s.consumer.groups[G]) == "range"
    assert parse_assignors(
        "org.apache.kafka.coordinator.group.assignor.RangeAssignor, uniform"
    ) == (
        "range",
        "uniform",
    )
    cfg = consumer_group_config({"group.consumer.assignors": "range"})
    assert cfg.assignors == ("range",) and cfg.session_timeout_ms == 45_000
    assert cfg.heartbeat_interval_ms == 5_000
    with pytest.raises(ConfigError, match="group.consumer.assignors: unknown assignor 'sticky'"):
        consumer_group_config({"group.consumer.assignors": "uniform,sticky"})


def test_topic_growth_bumps_the_epoch_and_reassigns():
    s = shard()
    hb(s, "A", 0)
    grown = {"t": (T1, 8)}
    a = hb(s, "A", 1, owned=owned(s, "A"), view=grown)
    assert a["member_epoch"] == 2 and parts(a) == set(range(8))


def test_commit_and_fetch_check_member_epochs():
    s = shard()
    hb(s, "A", 0)
    p = [CommitPartition("t", 0, 5, -1, "")]
    _, err, _ = s.commit(G, 1, "A", None, p, 0)
    assert err is None and s.groups[G].offsets[("t", 0)].offset == 5
    assert s.commit(G, 0, "A", None, p, 0)[1] == E.stale_member_epoch
    assert s.commit(G, 1, "B", None, p, 0)[1] == E.unknown_member_id
    assert s.commit(G, -1, "", None, p, 0)[1] == E.unknown_member_id  # group not empty
    assert s.validate_fetch(G, "A", 1) is None
    assert s.validate_fetch(G, "A", 0) == E.stale_member_epoch
    assert s.validate_fetch(G, None, -1) is None
    # the offsets are the group's, not a classic group's
    assert [g["group_type"] for g in s.list_groups(set(), set())] == ["consumer"]
    assert s.describe(G) is None


def test_classic_and_consumer_groups_do_not_mix():
    s = shard()
    hb(s, "A", 0)
    join = JoinRequest(G, "", None, 10_000, 10_000, "consumer", (("range", b""),), "c")
    r = s.join(join, "j", 0)
    assert r.completions[0][1]["error_code"] == E.inconsistent_group_protocol
    # a classic group with members refuses consumer heartbeats
    c = shard()
    classic = JoinRequest("cl", "", "inst", 10_000, 10_000, "consumer", (("range", b""),), "c")
    c.join(classic, "j", 0)
    req = HeartbeatRequest("cl", "m", 0, rebalance_timeout_ms=1, topics=("t",), owned=())
    resp = c.consumer_heartbeat(req, TOPICS, "t", 0).completions[0][1]
    assert resp["error_code"] == E.group_id_not_found


def test_empty_groups_convert_both_ways_keeping_offsets():
    s = shard()
    s.replay((OffsetKey("x", "t", 0), OffsetValue(7)))  # an empty classic group with offsets
    req = HeartbeatRequest("x", "m", 0, rebalance_timeout_ms=1, topics=("t",), owned=())
    result = s.consumer_heartbeat(req, TOPICS, "t", 0)
    assert result.records[0] == (GroupKey("x"), None)
    assert s.groups["x"].offsets[("t", 0)].offset == 7 and "x" in s.consumer.groups
    leave = HeartbeatRequest("x", "m", -1)
    s.consumer_heartbeat(leave, TOPICS, "t", 0)
    assert s.consumer.groups["x"].state == EMPTY
    join = JoinRequest("x", "", "i", 10_000, 10_000, "consumer", (("range", b""),), "c")
    s.join(join, "j", 0)
    assert "x" not in s.consumer.groups and s.groups["x"].offsets[("t", 0)].offset == 7


def test_delete_and_expire_consumer_groups():
    s = shard()
    hb(s, "A", 0)
    s.commit(G, 1, "A", None, [CommitPartition("t", 0, 5, -1, "")], 0)
    assert s.delete_group(G, 0)[1] == E.non_empty_group
    hb(s, "A", -1)
    result, code = s.delete_group(G, 0)
    assert code == E.none and G not in s.consumer.groups and G not in s.groups
    # expiry: offsets of an empty consumer group go after the retention, then the group
    s2 = shard()
    hb(s2, "A", 0)
    s2.commit(G, 1, "A", None, [CommitPartition("t", 0, 5, -1, "")], 0)
    s2.expire_offsets(10**12)
    assert ("t", 0) in s2.groups[G].offsets  # still subscribed
    hb(s2, "A", -1)
    s2.expire_offsets(10**12)
    assert G not in s2.consumer.groups and not s2.groups.get(G)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    st.integers(3, 8),
    st.binary(max_size=40),
    st.one_of(st.none(), st.binary(max_size=120)),
)
def test_garbage_records_fail_as_format_errors(kind: int, key: bytes, value: bytes | None):
    """The loader skips what it cannot read; it must never see another exception type."""
    try:
        decode_any(kind.to_bytes(2, "big") + key, value)
    except RecordFormatError:
        pass


def static_hb(s: CoordinatorShard, member: str, epoch: int, instance: str = "i1") -> dict:
    req = HeartbeatRequest(
        G,
        member,
        epoch,
        instance_id=instance,
        rebalance_timeout_ms=30_000 if epoch == 0 else -1,
        topics=("t",) if epoch == 0 else None,
        owned=() if epoch == 0 else None,
    )
    [(_, resp)] = s.consumer_heartbeat(req, TOPICS, "tok", 0).completions
    return resp


def test_static_member_comes_back_under_a_new_id_without_a_rebalance():
    s = shard()
    assert static_hb(s, "A", 0)["member_epoch"] == 1
    hb(s, "B", 0)
    hb(s, "A", 1, owned=owned(s, "A"))
    hb(s, "A", 1, owned=owned(s, "A"))
    hb(s, "B", 2, owned=[])
    g = s.consumer.groups[G]
    before, epoch = {p for _, ps in owned(s, "A") for p in ps}, g.epoch
    assert static_hb(s, "A2", 0)["error_code"] == E.unreleased_instance_id  # A still there
    left = static_hb(s, "A", -2)
    assert left["error_code"] == E.none and left["member_epoch"] == -2
    back = static_hb(s, "A2", 0)
    assert back["error_code"] == E.none and parts(back) == before
    assert g.epoch == epoch and set(g.members) == {"A2", "B"} and g.state == STABLE


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    st.dictionaries(
        st.sampled_from("abcdefg"), st.frozensets(st.sampled_from(["t", "u"]), min_size=1)
    ),
    st.integers(0, 12),
    st.integers(0, 5),
    st.booleans(),
)
def test_assignors_give_each_partition_to_one_subscriber(members, nt, nu, sticky):
    topics = {"t": (T1, nt), "u": (T2, nu)}
    for assignor in (uniform, range_assignor):
        previous = assignor(members, topics, {}) if sticky else {}
        shifted = {m: subs for m, subs in members.items() if m != "a"}  # one member gone
        out = assignor(shifted, topics, previous)
        seen: dict[tuple[uuid.UUID, int], str] = {}
        for m, owned_parts in out.items():
            for tid, ps in owned_parts.items():
                name = "t" if tid == T1 else "u"
                assert name in shifted[m]
                for p in ps:
                    assert (tid, p) not in seen and p < topics[name][1]
                    seen[(tid, p)] = m
        wanted = {
            (tid, p)
            for name, (tid, n) in topics.items()
            if any(name in subs for subs in shifted.values())
            for p in range(n)
        }
        assert set(seen) == wanted
        if assignor is uniform and len({subs for subs in shifted.values()}) == 1:
            counts = [sum(len(ps) for ps in out[m].values()) for m in shifted]
            assert max(counts) - min(counts) <= 1


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["join", "leave", "beat", "beat", "beat"]), st.sampled_from("ABCD")
        ),
        max_size=40,
    )
)
def test_clients_never_own_a_partition_twice_and_converge(steps):
    """Simulated clients (owned partitions = their last assignment) join, heartbeat, leave in
    any order: no partition is ever owned by two of them, and once they only heartbeat the
    group settles Stable with every partition owned once."""
    s = shard()
    clients: dict[str, tuple[int, dict]] = {}  # member -> (epoch, {topic id: partitions})

    def beat(member: str) -> None:
        epoch, mine = clients[member]
        resp = hb(s, member, epoch, owned=[(t, sorted(ps)) for t, ps in mine.items()])
        if resp["error_code"] in (E.fenced_member_epoch, E.unknown_member_id):
            clients[member] = (0, {})
            return
        assert resp["error_code"] == E.none
        if resp["assignment"] is not None:
            mine = {t: set(ps) for t, ps in resp["assignment"]}
        clients[member] = (resp["member_epoch"], mine)

    def check_disjoint() -> None:
        seen: set = set()
        for _, mine in clients.values():
            for t, ps in mine.items():
                for p in ps:
                    assert (t, p) not in seen
                    seen.add((t, p))

    for action, member in steps:
        if action == "join" and member not in clients:
            clients[member] = (0, {})
            beat(member)
        elif action == "leave" and member in clients:
            hb(s, member, -1, owned=None)
            del clients[member]
        elif action == "beat" and member in clients:
            beat(member)
        check_disjoint()
    for _ in range(6):
        for member in sorted(clients):
            beat(member)
            check_disjoint()
    if clients:
        assert s.consumer.groups[G].state == STABLE
        owned_all = [(t, p) for _, mine in clients.values() for t, ps in mine.items() for p in ps]
        assert sorted(owned_all) == [(T1, p) for p in range(6)]


def test_the_consumer_group_keys_are_broker_settings():
    from broker.config import BrokerConfig

    base = MINIMAL_BROKER
    cfg = consumer_group_config(BrokerConfig.from_properties(base))
    assert (cfg.assignors, cfg.session_timeout_ms, cfg.heartbeat_interval_ms) == (
        ("uniform", "range"),
        45_000,
        5_000,
    )
    set_ = BrokerConfig.from_properties(
        {
            **base,
            "group.consumer.assignors": "range",
            "group.consumer.session.timeout.ms": "30000",
            "group.consumer.heartbeat.interval.ms": "1000",
            "group.consumer.max.size": "10",
        }
    )
    cfg = consumer_group_config(set_)
    assert (cfg.assignors, cfg.session_timeout_ms, cfg.heartbeat_interval_ms, cfg.max_size) == (
        ("range",),
        30_000,
        1_000,
        10,
    )
    with pytest.raises(ConfigError):
        BrokerConfig.from_properties({**base, "group.consumer.heartbeat.interval.ms": "0"})
