"""Time-outs for many parked trio tasks without a cancel scope each.

A ``with trio.move_on_after(...)`` around every wait costs a cancel scope and a deadline-heap
entry per operation: at thousands of commands a second it was a tenth of the active
controller's CPU. :class:`Expiry` keeps the waiters' deadlines in one heap served by one trio
system task that sleeps until the earliest deadline of a waiter still waiting; a waiter
settled before its deadline is dropped when it reaches the top of the heap.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

import trio


class Waiter(Protocol):
    done: bool  # settled: its deadline no longer matters


W = TypeVar("W", bound=Waiter)


class Expiry(Generic[W]):
    """Calls ``expire(waiter)`` once a waiter's deadline passes while it is not ``done``."""

    def __init__(self, expire: Callable[[W], None], name: str = "expiry") -> None:
        self._expire = expire
        self._name = name
        self._heap: list[tuple[float, int, W]] = []
        self._tiebreak = itertools.count()
        self._wake = math.inf  # when the task wakes next
        self._scope: trio.CancelScope | None = None  # the task's wait, while it waits
        self._started = False
        self._closed = False

    def close(self) -> None:
        """Stop the task (its waiters no longer need a deadline, e.g. they all failed)."""
        self._closed = True
        self._heap.clear()
        if self._scope is not None:
            self._scope.cancel()

    def add(self, waiter: W, deadline: float) -> None:
        """Expire ``waiter`` at ``deadline`` (trio time) unless it is done by then. Call from
        the trio thread."""
        if deadline == math.inf or self._closed:
            return
        heapq.heappush(self._heap, (deadline, next(self._tiebreak), waiter))
        if deadline < self._wake:
            self._wake = deadline
            if self._scope is not None:
                self._scope.deadline = deadline
            elif not self._started:
                self._started = True
                trio.lowlevel.spawn_system_task(self._run, name=self._name)

    async def _run(self) -> None:
        heap = self._heap
        try:
            while not self._closed:
                with trio.CancelScope(deadline=self._wake) as self._scope:
                    await trio.sleep_forever()
                self._scope = None
                now = trio.current_time()
                while heap and (heap[0][2].done or heap[0][0] <= now):
                    waiter = heapq.heappop(heap)[2]
                    if not waiter.done:
                        self._expire(waiter)
                self._wake = heap[0][0] if heap else math.inf
        finally:  # the trio run ends (its waiters with it): a later run starts its own task
            heap.clear()
            self._scope, self._started, self._wake = None, False, math.inf
