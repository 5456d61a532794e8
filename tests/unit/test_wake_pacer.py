"""The brokers' long-poll wake-ups: at once after a quiet spell, then spaced by the linger."""

from __future__ import annotations

from kraft.wake_pacer import WakePacer


def test_first_wake_is_immediate_then_spaced_by_the_interval() -> None:
    p = WakePacer(0.010)
    assert p.delay(100.0) == 0.0  # nothing woken yet
    p.woke(100.0)
    assert abs(p.delay(100.004) - 0.006) < 1e-9  # entries 4 ms later wait for the rest
    p.woke(100.010)
    assert p.delay(100.050) == 0.0  # a quiet spell: at once again


def test_zero_interval_never_waits() -> None:
    p = WakePacer(0.0)
    p.woke(5.0)
    assert p.delay(5.0) == 0.0
