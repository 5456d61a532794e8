"""When to wake the brokers' FetchMetadata long-polls after entries are applied.

Leading edge, then at most once per ``interval``: the first entry applied after a quiet spell
wakes the waiting brokers at once (propagation is then one RPC answer away from the commit),
and while entries keep coming the wake-ups are spaced ``interval`` apart so that one answer
carries every entry applied meanwhile. The spacing protects the commit path: the Raft ticks run
on the same trio thread, and every answer going out delays the next commit.

Pure: the caller passes the clock.
"""

from __future__ import annotations


class WakePacer:
    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.last_wake: float | None = None

    def delay(self, now: float) -> float:
        """How long to wait, from ``now``, before the next wake-up (0: at once)."""
        if self.last_wake is None or self.interval_s <= 0:
            return 0.0
        return max(0.0, self.last_wake + self.interval_s - now)

    def woke(self, now: float) -> None:
        """A wake-up went out at ``now``."""
        self.last_wake = now
