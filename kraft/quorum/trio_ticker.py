"""PySyncObj driven from the trio thread: an epoll poller and the tick loop.

PySyncObj normally runs its own tick thread (``autoTick``). Every write then crossed threads
twice on the leader: trio → tick thread (a byte on PySyncObj's pipe) and back (a byte on trio's
wake-up socket), each a wake-up of a sleeping thread plus a GIL hand-off (figures in
``docs/performance.md``). Here PySyncObj runs with ``autoTick=False`` and
:class:`TickLoop` calls its tick on the trio thread instead:

* its sockets live in :class:`EpollPoller`, an epoll set whose own descriptor trio waits on
  (``wait_readable``), so a peer message wakes the trio loop, which ticks;
* a submitted command does not write to a pipe: the submitter appends and replicates it at once
  (PySyncObj's ``_checkCommandsToApply``, the part of a tick that does that), or, inside a tick,
  ``nudge()`` makes the loop tick again at once;
* PySyncObj's tick runs its logic (commit index, apply, sends) and then polls its sockets; woken
  by a socket, the loop polls first, so the acks that woke it are counted by the same tick. A
  tick whose own poll handled events is followed by another at once; otherwise the loop sleeps
  until the next event or ``period`` (PySyncObj's timers: elections, heartbeats);
* calls made from inside a tick (group answers, "applied" notices, leadership changes) are
  queued with :meth:`TickLoop.call_after_tick` and run after the tick, outside PySyncObj's
  internals (an exception there must never interrupt PySyncObj's apply loop).

Everything of PySyncObj now happens on one thread, so nothing of it needs a lock.
"""

from __future__ import annotations

import collections
import logging
import select
from collections.abc import Callable
from typing import Any

import trio
from pysyncobj.poller import POLL_EVENT_TYPE, Poller

logger = logging.getLogger(__name__)

_READ, _WRITE, _ERROR = POLL_EVENT_TYPE.READ, POLL_EVENT_TYPE.WRITE, POLL_EVENT_TYPE.ERROR


class EpollPoller(Poller):  # type: ignore[misc]  # pysyncobj ships no type hints
    """PySyncObj's poller interface over ``select.epoll`` (level-triggered, like its poll one).

    ``fileno()`` is the epoll set's descriptor: readable whenever one of its sockets has an
    event, which is what trio waits on. ``dispatched`` counts the events the last ``poll``
    handled."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._callbacks: dict[int, Callable[[int, int], None]] = {}
        self.dispatched = 0

    def fileno(self) -> int:
        return self._epoll.fileno()

    def subscribe(self, descr: int, callback: Callable[[int, int], None], eventMask: int) -> None:
        mask = 0
        if eventMask & _READ:
            mask |= select.EPOLLIN
        if eventMask & _WRITE:
            mask |= select.EPOLLOUT
        if eventMask & _ERROR:
            mask |= select.EPOLLERR
        if descr in self._callbacks:
            self._epoll.modify(descr, mask)
        else:
            self._epoll.register(descr, mask)
        self._callbacks[descr] = callback

    def unsubscribe(self, descr: int) -> None:
        if self._callbacks.pop(descr, None) is not None and not self._epoll.closed:
            try:
                self._epoll.unregister(descr)
            except OSError:  # already closed: the kernel dropped it from the set
                pass

    def poll(self, timeout: float) -> None:
        events = self._epoll.poll(timeout if timeout > 0 else 0)
        self.dispatched = len(events)
        for descr, event in events:
            callback = self._callbacks.get(descr)
            if callback is None:  # unsubscribed by an earlier callback of this round
                continue
            mask = 0
            if event & select.EPOLLIN:
                mask |= _READ
            if event & select.EPOLLOUT:
                mask |= _WRITE
            if event & (select.EPOLLERR | select.EPOLLHUP):
                mask |= _ERROR
            callback(descr, mask)

    def close(self) -> None:
        self._callbacks.clear()
        self._epoll.close()


class TickLoop:
    """Runs ``tick()`` (PySyncObj's ``doTick(0)``) on the trio thread; see the module docstring.

    It also stands in for PySyncObj's pipe notifier (``notify``: a queued command nudges it,
    unless ``notify_muted`` — the caller replicates the command itself)."""

    def __init__(self, tick: Callable[[], None], poller: EpollPoller, period: float) -> None:
        self._tick = tick
        self._poller = poller
        self._period = period
        self._calls: collections.deque[tuple[Callable[..., Any], tuple[Any, ...]]] = (
            collections.deque()
        )
        self._again = False
        self._waiting: trio.CancelScope | None = None
        self._scope: trio.CancelScope | None = None
        self._stopped = False
        self._in_tick = False
        self.notify_muted = False  # set while the caller does what a nudge would tick for
        self.ticks = 0

    @property
    def in_tick(self) -> bool:
        return self._in_tick

    def call_after_tick(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the trio thread once the current tick is over (or right after
        the next one, when called between ticks)."""
        self._calls.append((fn, args))
        if not self._in_tick:
            self.nudge()

    def nudge(self) -> None:
        """Tick as soon as possible (a command was queued, a call is waiting)."""
        self._again = True
        waiting = self._waiting
        if waiting is not None:
            waiting.cancel()

    def notify(self) -> None:
        """PySyncObj's PipeNotifier interface (a command was queued)."""
        if not self.notify_muted:
            self.nudge()

    def start(self) -> None:
        """Start the loop as a trio system task (it lives until :meth:`stop` or the end of the
        trio run). Call from the trio thread."""
        trio.lowlevel.spawn_system_task(self._run, name="raft-ticks")

    def stop(self) -> None:
        """Stop ticking (from the trio thread); calls still queued are dropped."""
        self._stopped = True
        self._calls.clear()
        if self._scope is not None:
            self._scope.cancel()

    async def _run(self) -> None:
        try:
            with trio.CancelScope() as self._scope:
                if not self._stopped:
                    await self._loop()
        finally:
            self._poller.close()  # no wait on its descriptor is registered any more

    async def _loop(self) -> None:
        readable = False
        while not self._stopped:
            self._again = False
            self._in_tick = True
            try:
                if readable:  # handle what woke us before the tick's logic, not after it
                    readable = False
                    self._poller.poll(0)
                self._tick()
                self.ticks += 1
            except Exception:  # as PySyncObj's own tick thread does: log, pause, go on
                logger.exception("raft tick failed")
                await trio.sleep(self._period)
                continue
            finally:
                self._in_tick = False
            self._run_calls()
            if self._stopped:
                break
            if self._again or self._poller.dispatched:
                await trio.lowlevel.checkpoint()  # let the RPC tasks run between ticks
                continue
            with trio.move_on_after(self._period) as self._waiting:
                await trio.lowlevel.wait_readable(self._poller.fileno())
                readable = True
            self._waiting = None

    def _run_calls(self) -> None:
        calls = self._calls
        while calls:
            fn, args = calls.popleft()
            try:
                fn(*args)
            except Exception:
                logger.exception("a call queued by the raft tick failed")
