"""Pure leader-side replication bookkeeping: follower fetch state, high watermark, ISR decisions.

Kafka's rules (``Partition.scala`` / ``Replica.scala``), with the clock passed in (ms):

* a follower fetching from offset ``o`` has log end offset ``o``; it was *caught up* at this
  fetch if ``o`` reaches the leader's log end now, or at its previous fetch if ``o`` reaches
  the leader's log end as it was then;
* the high watermark is the smallest log end offset among the ISR (a member whose position is
  not known yet holds it back); it never goes down;
* an ISR follower is *out of sync* when it is behind the leader's log end and was last caught
  up more than ``replica.lag.time.max.ms`` ago;
* a follower outside the ISR may join once it has reached both the high watermark and the
  start offset of the leader's current epoch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class FollowerState:
    """What the leader knows about one follower replica."""

    log_end_offset: int = -1  # unknown until it fetches
    last_caught_up_ms: float = 0.0
    last_fetch_leader_leo: int = -1
    last_fetch_ms: float = 0.0

    def on_fetch(self, fetch_offset: int, leader_leo: int, now_ms: float) -> None:
        """Record a fetch from ``fetch_offset`` while the leader's log ends at ``leader_leo``."""
        if fetch_offset >= leader_leo:
            self.last_caught_up_ms = max(self.last_caught_up_ms, now_ms)
        elif fetch_offset >= self.last_fetch_leader_leo >= 0:
            self.last_caught_up_ms = max(self.last_caught_up_ms, self.last_fetch_ms)
        self.log_end_offset = fetch_offset
        self.last_fetch_leader_leo = leader_leo
        self.last_fetch_ms = now_ms


def high_watermark(
    leader_id: int,
    leader_leo: int,
    isr: tuple[int, ...],
    followers: dict[int, FollowerState],
    current: int,
) -> int:
    """The high watermark the ISR allows (never below ``current``)."""
    hw = leader_leo
    for b in isr:
        if b == leader_id:
            continue
        f = followers.get(b)
        if f is None or f.log_end_offset < 0:
            return current
        hw = min(hw, f.log_end_offset)
    return max(hw, current)


def out_of_sync(
    leader_id: int,
    leader_leo: int,
    isr: tuple[int, ...],
    followers: dict[int, FollowerState],
    now_ms: float,
    lag_ms: int,
) -> list[int]:
    """ISR followers that have lagged more than ``lag_ms`` (the leader is never one)."""
    out = []
    for b in isr:
        if b == leader_id:
            continue
        f = followers.get(b)
        behind = f is None or f.log_end_offset < leader_leo
        last = f.last_caught_up_ms if f is not None else 0.0
        if behind and now_ms - last > lag_ms:
            out.append(b)
    return out


def may_join(follower: FollowerState, high_watermark_: int, epoch_start_offset: int) -> bool:
    """Whether a follower outside the ISR has caught up enough to be added."""
    leo = follower.log_end_offset
    return leo >= 0 and leo >= high_watermark_ and leo >= epoch_start_offset
