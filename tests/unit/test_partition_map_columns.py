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
