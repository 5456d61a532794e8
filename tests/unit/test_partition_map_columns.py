"""PartitionMap built from and read as columns (snapshot topic frames, topic digests)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kraft.metadata.partition_map import (
    PartitionMap,
    partition_chunks,
    sorted_partition_columns,
    sorted_partition_items,
)
from kraft.metadata.registrations import PartitionRegistration


def _reg(pid: int, epoch: int = 0) -> PartitionRegistration:
    return PartitionRegistration((pid % 7,), (pid % 7,), (), (), pid % 7, 0, epoch, epoch)


ids_lists = st.lists(st.integers(min_value=0, max_value=5000), max_size=300)


@given(ids_lists)
def test_of_columns_is_of_a_dict_of_the_pairs(ids):
    regs = [_reg(pid, i) for i, pid in enumerate(ids)]  # a repeated id: the later one wins
    built = PartitionMap.of_columns(ids, iter(regs))
    expected = PartitionMap.of(dict(zip(ids, regs)))
    assert built == expected and len(built) == len(expected)
    assert list(built.items()) == list(expected.items())  # same chunks, same order
    assert built._chunks.keys() == expected._chunks.keys()


@given(ids_lists, ids_lists)
def test_sorted_columns_are_the_sorted_items_unzipped(ids, updates):
    pm = PartitionMap.of({pid: _reg(pid) for pid in ids}).updated(
        {pid: _reg(pid, 1) for pid in updates}
    )
    items = sorted_partition_items(pm)
    columns = ([pid for pid, _ in items], [reg for _, reg in items])
    assert pm.sorted_columns() == columns
    assert sorted_partition_columns(pm) == columns
    assert sorted_partition_columns(dict(pm.items())) == columns


@given(ids_lists, ids_lists)
def test_partition_chunks_hold_the_items_in_their_order(ids, updates):
    pm = PartitionMap.of({pid: _reg(pid) for pid in ids}).updated(
        {pid: _reg(pid, 1) for pid in updates}
    )
    chunked = [item for chunk in partition_chunks(pm) for item in chunk.items()]
    assert chunked == list(pm.items())
    plain = dict(pm.items())
    assert [item for chunk in partition_chunks(plain) for item in chunk.items()] == chunked


def test_a_change_copies_one_small_chunk_and_shares_the_rest():
    pm = PartitionMap.of({pid: _reg(pid) for pid in range(100)})
    changed = pm.updated({37: _reg(37, 1)})
    assert changed[37] == _reg(37, 1) and pm[37] == _reg(37) and len(changed) == 100
    new = [c for c in changed.chunks() if not any(c is old for old in pm.chunks())]
    assert len(new) == 1 and len(new[0]) <= 16  # one 16-id chunk copied, 6 shared


@given(st.lists(st.integers(min_value=0, max_value=3000), max_size=50), st.integers(4096, 10**6))
def test_a_map_whose_ids_outgrow_small_chunks_keeps_every_partition(ids, big):
    pm = PartitionMap.of({pid: _reg(pid) for pid in ids})
    grown = pm.updated({big: _reg(big, 2)})
    expected = {pid: _reg(pid) for pid in ids} | {big: _reg(big, 2)}
    assert dict(grown.items()) == expected and len(grown) == len(expected)
    assert all(grown[pid] == reg and pid in grown for pid, reg in expected.items())
    assert grown.get(big + 1) is None and (big + 1) not in grown
    assert grown == PartitionMap.of(expected)
    again = grown.updated({0: _reg(0, 3)})  # large chunks from now on: no second rebuild
    assert again[0] == _reg(0, 3) and len(again) == len(expected | {0: None})


@given(st.integers(0, 5000), st.integers(0, 300), st.integers(0, 3))
def test_a_run_of_ascending_ids_is_cut_as_a_dict_of_them_would_be(start, count, short):
    ids = list(range(start, start + count))  # a snapshot frame's ids
    regs = [_reg(pid, 1) for pid in ids][: max(count - short, 0)]  # zip's shorter side wins
    built = PartitionMap.of_columns(ids, iter(regs))
    expected = PartitionMap.of(dict(zip(ids, regs)))
    assert built == expected and len(built) == len(regs)
    assert list(built.items()) == list(expected.items())
    assert built._chunks.keys() == expected._chunks.keys()
    assert built.sorted_columns() == expected.sorted_columns()
