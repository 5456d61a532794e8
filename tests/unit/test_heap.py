"""kraft.heap: the metadata image leaves the cyclic GC's reach after enough growth."""

import gc
import weakref

import pytest

from kraft.heap import HeapFreezer, freeze_heap, gc_paused


@pytest.fixture
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_freezer_freezes_after_every_records_and_not_before(unfrozen):
    freezer = HeapFreezer(every_records=10)
    assert not freezer.note(4) and gc.get_freeze_count() == 0
    kept = [[i] for i in range(1000)]  # tracked objects alive at the freeze
    assert freezer.note(6)
    assert gc.get_freeze_count() >= len(kept)
    assert not freezer.note(9)  # the count starts again


def test_freeze_collects_existing_garbage_first(unfrozen):
    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle that only the cyclic collector can free
    probe = weakref.ref(a)
    del a, b
    assert probe() is not None
    assert freeze_heap() >= 0
    assert probe() is None  # collected, not frozen forever
    with pytest.raises(ValueError):
        HeapFreezer(every_records=0)


def test_gc_paused_holds_the_collector_off_inside_only():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), gc_paused():
        raise ValueError("an error inside still turns it back on")
    assert gc.isenabled()


def test_gc_paused_leaves_a_disabled_collector_disabled():
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
