"""A count and its recent rate, as Kafka's ``Meter`` sensors expose them (``*-count`` and
``*-rate``): the rate is events per second over the last :data:`WINDOW_S` seconds, kept in
one-second buckets, so a scrape costs at most that many additions. The clock is given."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

WINDOW_S = 30


class RateMeter:
    """Events recorded so far and their per-second rate over the last window."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, window_s: int = WINDOW_S):
        self.clock = clock
        self.window_s = window_s
        self.count = 0
        self.started = clock()
        self._buckets: deque[list[int]] = deque()  # [second, events], oldest first

    def record(self, n: int = 1) -> None:
        """``n`` more events now."""
        self.count += n
        second = int(self.clock())
        if self._buckets and self._buckets[-1][0] == second:
            self._buckets[-1][1] += n
        else:
            self._buckets.append([second, n])
            self._trim(second)

    def _trim(self, second: int) -> None:
        while self._buckets and self._buckets[0][0] <= second - self.window_s:
            self._buckets.popleft()

    def rate(self) -> float:
        """Events per second over the last window (or since creation, if younger)."""
        now = self.clock()
        self._trim(int(now))
        span = min(float(self.window_s), max(1.0, now - self.started))
        return sum(n for _, n in self._buckets) / span
