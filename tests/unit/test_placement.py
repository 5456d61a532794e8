"""Striped, rack-aware replica placement (docs/kraft-notes.md, Replica placement)."""

from __future__ import annotations

import collections
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.controller.placement import PlacementBroker, place_replicas
from kraft.errors import ErrorCode, KraftError
from kraft.metadata.registrations import BrokerRegistration


def brokers(n, racks=None, fenced=()):
    return [
        PlacementBroker(i, None if racks is None else f"r{i % racks}", i in fenced)
        for i in range(n)
    ]


def test_every_partition_spans_all_racks_with_rf_equal_to_racks():
    bs = brokers(9, racks=3)
    rack_of = {b.id: b.rack for b in bs}
    for replicas in place_replicas(bs, 0, 300, 3, random.Random(7)):
        assert len({rack_of[b] for b in replicas}) == 3


def test_racks_beat_brokers_when_rf_exceeds_racks():
    bs = brokers(8, racks=2)
    rack_of = {b.id: b.rack for b in bs}
    for replicas in place_replicas(bs, 0, 100, 4, random.Random(1)):
        assert collections.Counter(rack_of[b] for b in replicas) == {"r0": 2, "r1": 2}
        assert len(set(replicas)) == 4


def test_leaders_and_replicas_spread_evenly():
    bs = brokers(9, racks=3)
    placed = place_replicas(bs, 0, 900, 3, random.Random(3))
    leaders = collections.Counter(p[0] for p in placed)
    assert set(leaders) == set(range(9)) and set(leaders.values()) == {100}
    replicas = collections.Counter(b for p in placed for b in p)
    assert set(replicas.values()) == {300}


def test_no_rack_single_broker_list():
    placed = place_replicas(brokers(5), 0, 50, 3, random.Random(0))
    assert all(len(set(p)) == 3 for p in placed)
    assert collections.Counter(p[0] for p in placed) == dict.fromkeys(range(5), 10)


def test_fenced_brokers_only_when_needed_and_never_first():
    bs = brokers(4, fenced={3})
    for p in place_replicas(bs, 0, 40, 3, random.Random(5)):
        assert 3 not in p
    for p in place_replicas(bs, 0, 40, 4, random.Random(5)):
        assert p[0] != 3 and sorted(p) == [0, 1, 2, 3]
    one_unfenced = brokers(3, fenced={1, 2})
    for p in place_replicas(one_unfenced, 0, 10, 3, random.Random(5)):
        assert p[0] == 0 and sorted(p) == [0, 1, 2]


def test_leader_moves_to_another_rack_when_the_stripe_rack_is_all_fenced():
    bs = [
        PlacementBroker(1, "a", True),
        PlacementBroker(2, "b", False),
        PlacementBroker(3, "c", False),
    ]
    for p in place_replicas(bs, 0, 30, 3, random.Random(9)):
        assert p[0] in (2, 3) and sorted(p) == [1, 2, 3]


def test_errors():
    with pytest.raises(KraftError) as e:
        place_replicas(brokers(3), 0, 1, 0, random.Random(0))
    assert e.value.code == ErrorCode.INVALID_REPLICATION_FACTOR
    with pytest.raises(KraftError, match="only 3 broker"):
        place_replicas(brokers(3), 0, 1, 4, random.Random(0))
    with pytest.raises(KraftError, match="fenced") as e:
        place_replicas(brokers(3, fenced={0, 1, 2}), 0, 1, 1, random.Random(0))
    assert e.value.code == ErrorCode.INVALID_REPLICATION_FACTOR
    with pytest.raises(KraftError, match="registered"):
        place_replicas([], 0, 1, 1, random.Random(0))


def test_registrations_in_controlled_shutdown_are_not_candidates():
    def reg(i, fenced=False, shutting_down=False):
        return BrokerRegistration(i, "x", 0, (), (), None, fenced, shutting_down)

    regs = [reg(1), reg(2, shutting_down=True), reg(3)]
    for p in place_replicas(regs, 0, 20, 2, random.Random(2)):
        assert sorted(p) == [1, 3]
    with pytest.raises(KraftError, match="controlled shutdown"):
        place_replicas(regs, 0, 1, 3, random.Random(2))


def test_deterministic_for_a_seed():
    bs = brokers(12, racks=4, fenced={5})
    a = place_replicas(bs, 0, 200, 3, random.Random(42))
    b = place_replicas(list(reversed(bs)), 0, 200, 3, random.Random(42))
    assert a == b
    assert a != place_replicas(bs, 0, 200, 3, random.Random(43))
    assert place_replicas(bs, 0, 0, 3, random.Random(1)) == []


def test_fast_enough():
    bs = brokers(50, racks=5, fenced={7, 14})
    t0 = time.process_time()
    placed = place_replicas(bs, 0, 100_000, 3, random.Random(1))
    assert len(placed) == 100_000
    assert time.process_time() - t0 < 3.0  # ~0.3 s; CPU time: other load does not count


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([None, "a", "b", "c", "d"]), st.booleans()),
        min_size=1,
        max_size=12,
    ),
    st.integers(1, 6),
    st.integers(0, 30),
    st.integers(0, 2**32),
    st.integers(0, 100),
)
def test_placement_properties(spec, rf, count, seed, start):
    bs = [PlacementBroker(i, rack, fenced) for i, (rack, fenced) in enumerate(spec)]
    if rf > len(bs) or all(b.fenced for b in bs):
        with pytest.raises(KraftError):
            place_replicas(bs, start, count, rf, random.Random(seed))
        return
    placed = place_replicas(bs, start, count, rf, random.Random(seed))
    assert placed == place_replicas(bs, start, count, rf, random.Random(seed))
    by_id = {b.id: b for b in bs}
    racks = {b.rack for b in bs}
    unfenced_per_rack = collections.Counter(b.rack for b in bs if not b.fenced)
    assert len(placed) == count
    for p in placed:
        assert len(p) == rf and len(set(p)) == rf and set(p) <= set(by_id)
        assert not by_id[p[0]].fenced
        # rack spread: as many racks as possible
        assert len({by_id[b].rack for b in p}) == min(rf, len(racks))
        # inside a rack, a fenced broker only once the rack's unfenced ones are all used
        for rack in racks:
            chosen = [b for b in p if by_id[b].rack == rack]
            if any(by_id[b].fenced for b in chosen):
                assert sum(not by_id[b].fenced for b in chosen) == unfenced_per_rack[rack]
