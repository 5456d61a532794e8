"""The quorum's crossing from PySyncObj's tick thread into trio (``raft._TrioBridge``)."""
from __future__ import annotations

import threading
import time

import trio

from kraft.quorum.raft import _TrioBridge


class _CountingToken:
    """A real trio token that counts the wake-ups asked of it."""

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self.token = token
        self.wakeups = 0

    def run_sync_soon(self, fn, *args) -> None:
        self.wakeups += 1
        self.token.run_sync_soon(fn, *args)


def _run_from_thread(step) -> tuple[list[int], int]:
    """Run ``step(bridge, seen)`` on a plain thread while trio waits; returns (seen, wakeups)."""
    seen: list[int] = []

    async def main() -> int:
        token = _CountingToken(trio.lowlevel.current_trio_token())
        bridge = _TrioBridge(token)  # type: ignore[arg-type]
        done = threading.Event()
        thread = threading.Thread(target=lambda: (step(bridge, seen), done.set()))
        thread.start()
        with trio.fail_after(10):
            while not done.is_set() or len(seen) < 3:
                await trio.sleep(0.005)
        thread.join(5)
        return token.wakeups

    wakeups = trio.run(main)
    return seen, wakeups


def test_held_calls_run_in_order_with_one_wakeup() -> None:
    def step(bridge: _TrioBridge, seen: list[int]) -> None:
        bridge.hold()
        for i in range(3):
            bridge.call_soon(seen.append, i)
        bridge.release()

    seen, wakeups = _run_from_thread(step)
    assert seen == [0, 1, 2]
    assert wakeups == 1


def test_unheld_calls_each_reach_trio() -> None:
    def step(bridge: _TrioBridge, seen: list[int]) -> None:
        for i in range(3):
            bridge.call_soon(seen.append, i)
            deadline = time.monotonic() + 5
            while len(seen) <= i and time.monotonic() < deadline:  # trio ran the call
                time.sleep(0.001)

    seen, wakeups = _run_from_thread(step)
    assert seen == [0, 1, 2]
    assert wakeups == 3


def test_a_long_hold_does_not_hold_answers_back() -> None:
    def step(bridge: _TrioBridge, seen: list[int]) -> None:
        bridge.hold()
        bridge.call_soon(seen.append, 0)
        time.sleep(_TrioBridge.MAX_HOLD_S * 2)
        bridge.call_soon(seen.append, 1)  # the hold is old: this one schedules a run
        deadline = time.monotonic() + 5
        while len(seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        observed_during_hold = list(seen)
        bridge.call_soon(seen.append, 2)
        bridge.release()
        assert observed_during_hold == [0, 1]

    seen, wakeups = _run_from_thread(step)
    assert seen == [0, 1, 2]
    assert wakeups == 2
