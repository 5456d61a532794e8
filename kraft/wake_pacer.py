"""When to wake the brokers' FetchMetadata long-polls after entries are applied.

Leading edge, then spaced: the first entry applied after a quiet spell wakes the waiting
brokers at once (propagation is then one RPC answer away from the commit), and while entries
keep coming the wake-ups are spaced so that one answer carries every entry applied meanwhile.
The spacing protects the commit path: the Raft ticks run on the same trio thread, and every
answer going out delays the next commit. Its cost grows with the brokers answered, so the
spacing does too: ``per_waiter_s`` for each broker the last wake-up answered, never more than
``interval_s`` (``metadata.fetch.linger.ms``). A few brokers are answered within milliseconds;
many share the thread at most as often as the linger allows.

Pure: the caller passes the clock and the number of brokers answered.
"""

from __future__ import annotations


class WakePacer:
    def __init__(self, interval_s: float, per_waiter_s: float) -> None:
        self.interval_s = interval_s
        self.per_waiter_s = per_waiter_s
        self.spacing_s = interval_s
        self.last_wake: float | None = None

    def delay(self, now: float) -> float:
        """How long to wait, from ``now``, before the next wake-up (0: at once)."""
        if self.last_wake is None or self.spacing_s <= 0:
            return 0.0
        return max(0.0, self.last_wake + self.spacing_s - now)

    def woke(self, now: float, waiters: int) -> None:
        """A wake-up went out at ``now``, answering ``waiters`` long-polls."""
        self.last_wake = now
        self.spacing_s = min(self.interval_s, self.per_waiter_s * waiters)
