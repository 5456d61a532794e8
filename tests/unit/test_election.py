"""Leader election rules (docs/kraft-notes.md, Leader election), one test per rule."""

from __future__ import annotations

import uuid

import pytest

from kraft.controller.election import (
    ONLINE,
    PREFERRED,
    UNCLEAN,
    build_partition_change,
    changes_for_controlled_shutdown,
    changes_for_fenced_broker,
    changes_for_unfenced_broker,
    complete_reassignment,
    elect_preferred_leader,
    elect_unclean_leader,
    leaderless_isr_brokers,
)
from kraft.errors import ErrorCode
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.registrations import PartitionRegistration
from kraft.records import (
    LEADER_NONE,
    LEADER_UNCHANGED,
    RECOVERED,
    RECOVERING,
    RECOVERY_UNCHANGED,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
)

T = str(uuid.UUID(int=7))


def reg(replicas, isr=None, leader=None, recovery=RECOVERED, removing=(), adding=()):
    replicas = tuple(replicas)
    isr = replicas if isr is None else tuple(isr)
    leader = (isr[0] if isr else LEADER_NONE) if leader is None else leader
    return PartitionRegistration(
        replicas, isr, tuple(removing), tuple(adding), leader, recovery, 3, 9
    )


def everyone(_b):
    return True


def only(*ok):
    return lambda b: b in ok


def change(part, acceptable=everyone, **kw):
    return build_partition_change(T, 0, part, acceptable, **kw)


# ---- online ------------------------------------------------------------------------------------


def test_no_change_gives_none():
    assert change(reg([1, 2, 3])) is None
    assert change(reg([1, 2, 3]), target_isr=[1, 2, 3]) is None


def test_online_keeps_an_acceptable_leader_in_the_isr():
    r = change(reg([1, 2, 3], leader=2), target_isr=[2, 3])
    assert r.isr == (2, 3) and r.leader == LEADER_UNCHANGED and r.election is None


def test_online_picks_first_isr_replica_in_replica_order():
    r = change(reg([3, 1, 2], isr=[1, 2, 3], leader=3), only(1, 2), target_isr=[2, 1])
    assert r.leader == 1 and r.isr == (2, 1) and r.election == "clean"


def test_online_unacceptable_leader_is_replaced():
    r = change(reg([1, 2, 3]), only(2, 3))
    assert r.leader == 2 and r.isr is None and r.election == "clean"


def test_online_no_candidate_means_no_leader():
    r = change(reg([1, 2], isr=[1, 2]), only(3), target_isr=[1, 2])
    assert r.leader == LEADER_NONE and r.election is None


def test_isr_is_never_emptied():
    part = reg([1, 2], isr=[1], leader=1)
    r = change(part, only(2), target_isr=[])
    assert r.isr is None and r.leader == LEADER_NONE  # 1 stays in the ISR, leaderless
    after = part.merge(r)
    assert after.isr == (1,) and after.leader_epoch == 4


def test_recovery_state_target():
    r = change(reg([1], recovery=RECOVERING), target_recovery_state=RECOVERED)
    assert r.leader_recovery_state == RECOVERED and r.leader == LEADER_UNCHANGED
    assert change(reg([1]), target_recovery_state=RECOVERED) is None


# ---- unclean ------------------------------------------------------------------------------------


def test_unclean_takes_first_acceptable_replica_and_resets_isr():
    part = reg([1, 2, 3], isr=[1], leader=LEADER_NONE)
    r = change(part, only(2, 3), election=UNCLEAN)
    assert (r.leader, r.isr, r.leader_recovery_state, r.election) == (
        2,
        (2,),
        RECOVERING,
        "unclean",
    )


def test_unclean_allowed_turns_online_into_unclean():
    part = reg([1, 2, 3], isr=[1], leader=LEADER_NONE)
    assert change(part, only(3)) is None
    r = change(part, only(3), unclean_allowed=True)
    assert r.leader == 3 and r.isr == (3,) and r.election == "unclean"


def test_unclean_prefers_a_clean_candidate():
    part = reg([1, 2, 3], isr=[1, 3], leader=1)
    r = change(part, only(2, 3), election=UNCLEAN)
    assert r.leader == 3 and r.isr is None and r.election == "clean"


# ---- preferred ----------------------------------------------------------------------------------


def test_preferred_elects_replica_zero():
    r = change(reg([1, 2, 3], leader=2), election=PREFERRED)
    assert r.leader == 1 and r.election == "preferred"


def test_preferred_keeps_current_leader_when_replica_zero_cannot_lead():
    assert change(reg([1, 2, 3], leader=2), only(2, 3), election=PREFERRED) is None
    assert change(reg([1, 2, 3], isr=[2, 3], leader=2), election=PREFERRED) is None


def test_preferred_falls_back_to_another_isr_replica_when_leaderless():
    r = change(reg([1, 2, 3], leader=LEADER_NONE), only(3), election=PREFERRED)
    assert r.leader == 3 and r.election == "clean"


def test_elect_preferred_leader_outcomes():
    assert (
        elect_preferred_leader(T, 0, reg([1, 2]), everyone).error == ErrorCode.ELECTION_NOT_NEEDED
    )
    out = elect_preferred_leader(T, 0, reg([1, 2], leader=2), only(2))
    assert out == (None, ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE)
    out = elect_preferred_leader(T, 0, reg([1, 2], leader=2), everyone)
    assert out.error == ErrorCode.NONE and out.record.leader == 1


def test_elect_unclean_leader_outcomes():
    assert elect_unclean_leader(T, 0, reg([1, 2]), everyone).error == ErrorCode.ELECTION_NOT_NEEDED
    part = reg([1, 2], isr=[1], leader=LEADER_NONE)
    assert (
        elect_unclean_leader(T, 0, part, only()).error == ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE
    )
    out = elect_unclean_leader(T, 0, part, only(2))
    assert out.error == ErrorCode.NONE and (out.record.leader, out.record.isr) == (2, (2,))


def test_unknown_election_type():
    with pytest.raises(ValueError):
        change(reg([1]), election="sideways")


# ---- epochs and reassignment ---------------------------------------------------------------------


def test_dropping_a_replica_sets_the_leader_to_bump_its_epoch():
    part = reg([1, 2, 3], leader=1)
    r = change(part, target_replicas=[1, 2], target_isr=[1, 2])
    assert r.leader == 1 and r.replicas == (1, 2)
    assert part.merge(r).leader_epoch == part.leader_epoch + 1
    # a pure reorder keeps the leader epoch
    r = change(part, target_replicas=[2, 1, 3])
    assert r.leader == LEADER_UNCHANGED and r.replicas == (2, 1, 3)


def test_reassignment_completes_when_the_isr_covers_the_target():
    # moving [1,2] -> [2,3]: replicas [2,3,1], adding [3], removing [1]
    part = reg([2, 3, 1], isr=[1, 2], leader=1, removing=[1], adding=[3])
    assert change(part, target_isr=[1, 2]) is None  # 3 not caught up yet
    r = change(part, target_isr=[1, 2, 3])
    assert r.replicas == (2, 3) and r.isr == (2, 3)
    assert r.removing_replicas == () and r.adding_replicas == ()
    assert r.leader == 2 and r.election == "clean"  # the old leader was removed


def test_complete_reassignment_rules():
    assert complete_reassignment((1, 2), (1, 2), (), ()) is None
    assert complete_reassignment((2, 3, 1), (1,), (1,), (3,)) is None  # ISR would be empty
    assert complete_reassignment((2, 3, 1), (1, 2, 3), (1,), (3,)) == ((2, 3), (2, 3))
    assert complete_reassignment((1, 2, 3), (1, 2), (), (3,)) is None
    assert complete_reassignment((1, 2, 3), (1, 2, 3), (), (3,)) == ((1, 2, 3), (1, 2, 3))


# ---- broker transitions --------------------------------------------------------------------------

EP = ({"name": "PLAINTEXT", "host": "h", "port": 1, "security_protocol": "PLAINTEXT"},)


def cluster(*partitions, fenced=(), brokers=(1, 2, 3)):
    delta = MetadataDelta(MetadataImage.EMPTY)
    for b in brokers:
        delta.replay(RegisterBrokerRecord(b, f"inc-{b}", b, EP, (), None, b in fenced, False))
    delta.replay(TopicRecord("t", T))
    for pid, (replicas, isr, leader) in enumerate(partitions):
        delta.replay(
            PartitionRecord(pid, T, tuple(replicas), tuple(isr), (), (), leader, RECOVERED, 0, 0)
        )
    return delta.apply()


def test_fencing_removes_the_broker_from_isrs_and_moves_leadership():
    image = cluster(
        ([1, 2, 3], [1, 2, 3], 1), ([2, 1], [2, 1], 2), ([1, 3], [1], 1), ([2, 3], [2, 3], 2)
    )
    records = changes_for_fenced_broker(image, 1)
    by_pid = {r.partition_id: r for r in records}
    assert set(by_pid) == {0, 1, 2}
    assert (by_pid[0].isr, by_pid[0].leader) == ((2, 3), 2)
    assert (by_pid[1].isr, by_pid[1].leader) == ((2,), LEADER_UNCHANGED)
    assert (by_pid[2].isr, by_pid[2].leader) == (None, LEADER_NONE)  # last ISR member stays
    assert [r.partition_id for r in records] == [0, 2, 1]  # the partitions it led first


def test_fencing_with_unclean_allowed_elects_outside_the_isr():
    image = cluster(([1, 3], [1], 1))
    (r,) = changes_for_fenced_broker(image, 1, unclean_allowed=lambda topic: topic.name == "t")
    assert (r.leader, r.isr, r.leader_recovery_state) == (3, (3,), RECOVERING)


def test_controlled_shutdown_moves_leadership_away():
    image = cluster(([1, 2], [1, 2], 1))
    (r,) = changes_for_controlled_shutdown(image, 1)
    assert (r.leader, r.isr) == (2, (2,))


def test_unfencing_gives_leaderless_partitions_a_leader():
    image = cluster(
        ([1, 2], [1], LEADER_NONE), ([2, 1], [2], LEADER_NONE), ([1, 2], [1, 2], 2), fenced=(1, 2)
    )
    records = changes_for_unfenced_broker(image, 1)
    assert [(r.partition_id, r.leader, r.election) for r in records] == [(0, 1, "clean")]
    records = changes_for_unfenced_broker(image, 1, unclean_allowed=lambda topic: True)
    assert [(r.partition_id, r.leader, r.isr) for r in records] == [(0, 1, None), (1, 1, (1,))]


def test_leaderless_isr_brokers_names_who_could_lead_now():
    image = cluster(
        ([1, 2], [1], LEADER_NONE),  # 1 could lead it
        ([2, 3], [2, 3], LEADER_NONE),  # 3 could, 2 is fenced
        ([3, 1], [3], 3),  # has a leader
        fenced=(2,),
    )
    active = frozenset(b for b, r in image.brokers.items() if not r.fenced)
    assert leaderless_isr_brokers(image.topics_by_id.values(), active) == {1, 3}
    assert leaderless_isr_brokers(image.topics_by_id.values(), frozenset({2})) == {2}
    assert leaderless_isr_brokers([], active) == set()


def test_records_apply_cleanly():
    image = cluster(([1, 2, 3], [1, 2, 3], 1), ([1, 3], [1], 1))
    delta = MetadataDelta(image)
    for r in changes_for_fenced_broker(image, 1):
        delta.replay(r)
    after = delta.apply()
    assert after.partition(T, 0).leader == 2 and after.partition(T, 0).leader_epoch == 1
    assert after.partition(T, 1).leader == LEADER_NONE and after.partition(T, 1).isr == (1,)
    assert RECOVERY_UNCHANGED != RECOVERED and ONLINE == "online"


def test_leaving_change_is_the_builder_spelt_out():
    """``leaving_change`` (the fencing / controlled-shutdown hot loop) gives exactly the record
    ``build_partition_change`` gives for the ISR without the leaving broker, over random
    partitions: leaders in and out of the ISR, leaderless, empty ISRs, reassignments in
    progress, RECOVERING partitions, unclean elections allowed or not."""
    import random

    from kraft.controller.election import leaving_change

    rng = random.Random(8)
    brokers = list(range(6))
    for _ in range(20_000):
        replicas = tuple(rng.sample(brokers, rng.randint(0, 4)))
        isr = tuple(b for b in replicas if rng.random() < 0.7)
        if rng.random() < 0.1 and 5 not in isr:
            isr += (5,)  # an ISR member outside the replicas
        leader = rng.choice(
            [*isr, LEADER_NONE, *([rng.choice(brokers)] if rng.random() < 0.1 else [])]
        )
        removing = tuple(b for b in replicas if rng.random() < 0.1)
        adding = tuple(b for b in replicas if rng.random() < 0.1 and b not in removing)
        part = PartitionRegistration(
            replicas, isr, removing, adding, leader, rng.choice([RECOVERED, RECOVERING]), 3, 9
        )
        leaving = rng.choice(brokers)
        acceptable = frozenset(b for b in brokers if b != leaving and rng.random() < 0.7)
        unclean = rng.random() < 0.3
        expected = build_partition_change(
            T,
            4,
            part,
            acceptable.__contains__,
            target_isr=[b for b in isr if b != leaving],
            unclean_allowed=unclean,
        )
        assert leaving_change(T, 4, part, leaving, acceptable, unclean) == expected, (
            part,
            leaving,
            acceptable,
        )
        several = frozenset(rng.sample(brokers, rng.randint(1, 3)))  # fenced together
        acceptable = frozenset(b for b in brokers if b not in several and rng.random() < 0.7)
        expected = build_partition_change(
            T,
            4,
            part,
            acceptable.__contains__,
            target_isr=[b for b in isr if b not in several],
            unclean_allowed=unclean,
        )
        assert leaving_change(T, 4, part, several, acceptable, unclean) == expected, (
            part,
            several,
            acceptable,
        )


def _random_cluster(rng, topics: int, brokers: int) -> MetadataImage:
    """Topics of random partitions over ``brokers``: ISRs of one member, reassignments, leaders
    outside the ISR and leaderless partitions among them."""
    delta = MetadataDelta(MetadataImage.EMPTY)
    ids = range(1, brokers + 1)
    for b in ids:
        delta.replay(RegisterBrokerRecord(b, f"inc-{b}", b, EP, (), None, False, False))
    for t in range(topics):
        tid = str(uuid.UUID(int=100 + t))
        delta.replay(TopicRecord(f"topic-{rng.randrange(1000):03d}-{t}", tid))
        for pid in rng.sample(range(3000), rng.randrange(1, 12)):  # ids across chunks too
            replicas = tuple(rng.sample(ids, rng.randrange(1, 4)))
            isr = tuple(b for b in replicas if rng.random() < 0.7) or replicas[:1]
            leader = rng.choice([*isr, LEADER_NONE]) if rng.random() < 0.9 else replicas[-1]
            removing = replicas[-1:] if len(replicas) > 1 and rng.random() < 0.1 else ()
            record = PartitionRecord(pid, tid, replicas, isr, removing, (), leader, RECOVERED, 0, 0)
            delta.replay(record)
    return delta.apply()


@pytest.mark.parametrize("seed", range(12))
def test_a_resumed_leaving_transition_writes_what_a_scan_from_the_start_does(seed):
    """Each step of a leaving transition resumed where the previous one stopped (the second
    pass examining only the partitions the first noted) yields the records a scan of the whole
    image from the start yields, up to the end, with and without unclean elections and with
    brokers leaving together."""
    import random

    from kraft.controller.election import leaving_changes

    rng = random.Random(seed)
    image = _random_cluster(rng, topics=30, brokers=5)
    unclean_topics = {t for t in image.topics_by_id if rng.random() < 0.3}

    def unclean(topic):
        return topic.topic_id in unclean_topics

    also = frozenset({2}) if seed % 3 == 0 else frozenset()
    limit = rng.choice([1, 2, 5])
    point = None
    steps = 0
    while True:
        resumed, point_after = leaving_changes(image, 1, unclean, limit, point, also)
        scanned, _ = leaving_changes(image, 1, unclean, limit, None, also)
        assert resumed == scanned
        delta = MetadataDelta(image)
        for record in resumed:
            delta.replay(record)
        image, point = delta.apply(), point_after
        steps += 1
        if point is None:
            break
    assert leaving_changes(image, 1, unclean, None, None, also)[0] == []
    assert steps > 1
