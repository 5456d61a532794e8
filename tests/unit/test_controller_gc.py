"""A controller process runs without automatic cyclic collection; its GC loop collects when no
full collection (a heap freeze) ran for a while."""

from __future__ import annotations

import gc

import trio
import trio.testing

from kraft.controller_server import GC_INTERVAL_S, ControllerServer


def _full_collections() -> int:
    return int(gc.get_stats()[2]["collections"])


def test_gc_loop_collects_only_when_no_full_collection_ran_and_the_collector_is_off():
    server = object.__new__(ControllerServer)  # the loop uses no state of the server
    counts: list[int] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server._gc_loop)
            await trio.sleep(GC_INTERVAL_S * 1.5)  # first round: only notes the count
            counts.append(_full_collections())
            await trio.sleep(GC_INTERVAL_S)  # nothing ran meanwhile: the loop collects
            counts.append(_full_collections())
            gc.collect()  # a freeze's collection: the next round skips
            counts.append(_full_collections())
            await trio.sleep(GC_INTERVAL_S)
            counts.append(_full_collections())
            nursery.cancel_scope.cancel()

    gc.disable()
    try:
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        gc.enable()
    assert counts[1] == counts[0] + 1
    assert counts[3] == counts[2]


def test_gc_loop_leaves_an_enabled_collector_alone():
    server = object.__new__(ControllerServer)
    before: list[int] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server._gc_loop)
            before.append(_full_collections())
            await trio.sleep(GC_INTERVAL_S * 3.5)
            before.append(_full_collections())
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert before[1] - before[0] <= 1  # at most one the interpreter ran by itself
