"""The brokers' long-poll wake-ups: at once after a quiet spell, then spaced by the linger, or
by a cost per broker answered when that is shorter."""

from __future__ import annotations

import pytest

from kraft.wake_pacer import WakePacer


def test_first_wake_is_immediate_then_spaced_by_the_interval() -> None:
    p = WakePacer(0.010, 0.005)
    assert p.delay(100.0) == 0.0  # nothing woken yet
    p.woke(100.0, 3)
    assert abs(p.delay(100.004) - 0.006) < 1e-9  # entries 4 ms later wait for the rest
    p.woke(100.010, 3)
    assert p.delay(100.050) == 0.0  # a quiet spell: at once again


def test_zero_interval_never_waits() -> None:
    p = WakePacer(0.0, 0.001)
    p.woke(5.0, 60)
    assert p.delay(5.0) == 0.0


@pytest.mark.parametrize(
    ("waiters", "spacing"),
    [(0, 0.0), (1, 0.001), (3, 0.003), (19, 0.019), (20, 0.020), (60, 0.020), (1000, 0.020)],
)
def test_spacing_grows_with_the_brokers_answered_up_to_the_linger(
    waiters: int, spacing: float
) -> None:
    p = WakePacer(0.020, 0.001)
    p.woke(10.0, waiters)
    assert p.delay(10.0) == pytest.approx(spacing)
    assert p.delay(10.0 + spacing) == 0.0


def test_the_spacing_follows_the_last_wake_up() -> None:
    p = WakePacer(0.020, 0.001)
    p.woke(1.0, 60)
    assert p.delay(1.005) == pytest.approx(0.015)
    p.woke(1.020, 2)  # most brokers left (or are busy replaying): 2 ms from now on
    assert p.delay(1.021) == pytest.approx(0.001)
