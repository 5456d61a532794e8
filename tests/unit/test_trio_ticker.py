"""PySyncObj's ticks on the trio thread (``kraft.quorum.trio_ticker``): the epoll poller and the
tick loop, with Unix socket pairs and a real trio loop on a virtual clock (``MockClock``
jumps over idle time, so periods of seconds take no real time)."""

from __future__ import annotations

import logging
import socket

import pytest
import trio
from trio.testing import MockClock

from kraft.quorum.trio_ticker import EpollPoller, TickLoop

READ, WRITE, ERROR = 1, 2, 4

pytestmark = pytest.mark.timeout(60)


def test_epoll_poller_dispatches_like_pysyncobjs_poll_poller() -> None:
    poller = EpollPoller()
    a, b = socket.socketpair()
    seen: list[tuple[int, int]] = []
    try:
        poller.subscribe(a.fileno(), lambda fd, ev: seen.append((fd, ev)), READ | ERROR)
        poller.poll(0)
        assert seen == [] and poller.dispatched == 0
        b.send(b"x")
        poller.poll(1)
        assert seen == [(a.fileno(), READ)] and poller.dispatched == 1
        # subscribing again changes the mask (PySyncObj does this to add or drop WRITE)
        seen.clear()
        poller.subscribe(a.fileno(), lambda fd, ev: seen.append((fd, ev)), READ | WRITE | ERROR)
        poller.poll(0)
        assert seen == [(a.fileno(), READ | WRITE)]
        # unsubscribed: no more events; unsubscribing twice is harmless
        seen.clear()
        poller.unsubscribe(a.fileno())
        poller.unsubscribe(a.fileno())
        poller.poll(0)
        assert seen == [] and poller.dispatched == 0
        # a closed peer is reported as readable + error (hang-up)
        poller.subscribe(a.fileno(), lambda fd, ev: seen.append((fd, ev)), READ | ERROR)
        b.close()
        poller.poll(1)
        assert seen and seen[0][1] & READ and seen[0][1] & ERROR
    finally:
        a.close()
        poller.close()


def test_epoll_poller_skips_a_descriptor_unsubscribed_by_an_earlier_callback() -> None:
    poller = EpollPoller()
    pairs = [socket.socketpair() for _ in range(2)]
    calls: list[int] = []
    try:
        fds = [p[0].fileno() for p in pairs]

        def first(fd: int, ev: int) -> None:
            calls.append(fd)
            for other in fds:
                if other != fd:
                    poller.unsubscribe(other)

        for fd in fds:
            poller.subscribe(fd, first, READ)
        for _, b in pairs:
            b.send(b"x")
        poller.poll(1)
        assert len(calls) == 1  # the second descriptor's event was dropped with it
    finally:
        for a, b in pairs:
            a.close()
            b.close()
        poller.close()


async def _until(cond, timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not cond():
            await trio.sleep(0.001)


def test_tick_loop_ticks_on_socket_events_nudges_and_its_period() -> None:
    trio.run(_ticks_on_events_nudges_and_period, clock=MockClock(autojump_threshold=0))


async def _ticks_on_events_nudges_and_period() -> None:
    poller = EpollPoller()
    a, b = socket.socketpair()
    a.setblocking(False)
    received: list[bytes] = []
    ticks: list[float] = []

    def on_read(fd: int, ev: int) -> None:
        received.append(a.recv(100))

    def tick() -> None:
        ticks.append(trio.current_time())
        poller.poll(0)

    poller.subscribe(a.fileno(), on_read, READ)
    loop = TickLoop(tick, poller, period=2.0)
    loop.start()
    try:
        await _until(lambda: len(ticks) >= 1)
        # a message wakes the loop at once (virtual time: well before the 2 s period)
        t0 = trio.current_time()
        b.send(b"hello")
        await _until(lambda: received == [b"hello"], 1.0)
        assert trio.current_time() - t0 < 0.1
        # idle: one tick per period (at +2 s and +4 s of a 4.5 s window of virtual time)
        n = len(ticks)
        await trio.sleep(4.5)  # an observation window, not a synchronisation
        assert 2 <= len(ticks) - n <= 3
        # a nudge ticks at once
        n = len(ticks)
        loop.nudge()
        await _until(lambda: len(ticks) > n, 1.0)
    finally:
        loop.stop()
        b.close()
    await _until(lambda: poller._epoll.closed)  # the loop closed its poller on the way out
    a.close()


def test_calls_made_inside_a_tick_run_after_it_and_failures_do_not_stop_the_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    trio.run(_calls_after_tick_and_failures, caplog, clock=MockClock(autojump_threshold=0))


async def _calls_after_tick_and_failures(caplog: pytest.LogCaptureFixture) -> None:
    poller = EpollPoller()
    order: list[str] = []
    state = {"n": 0}
    loop: TickLoop

    def tick() -> None:
        state["n"] += 1
        n = state["n"]
        if n == 2:
            order.append("tick 2")
            loop.call_after_tick(order.append, "after 2")
            loop.call_after_tick(lambda: 1 / 0)  # logged, the loop goes on
            order.append("tick 2 end")
        elif n == 3:
            raise RuntimeError("a failing tick")  # logged, the loop goes on

    loop = TickLoop(tick, poller, period=0.01)
    with caplog.at_level(logging.ERROR, logger="kraft.quorum.trio_ticker"):
        loop.start()
        await _until(lambda: state["n"] >= 6)
        loop.stop()
    assert order == ["tick 2", "tick 2 end", "after 2"]
    messages = [r.getMessage() for r in caplog.records]
    assert any("queued by the raft tick failed" in m for m in messages)
    assert any("raft tick failed" in m for m in messages)
    # a call queued between ticks runs right after the next one, which comes at once
    n = state["n"]
    loop2 = TickLoop(tick, EpollPoller(), period=10.0)
    loop2.start()
    await trio.sleep(0.05)
    ran: list[int] = []
    loop2.call_after_tick(lambda: ran.append(state["n"]))
    await _until(lambda: ran, 1.0)
    assert ran[0] > n
    loop2.stop()
