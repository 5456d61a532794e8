"""Group commit on the trio side of the quorum.

Commands submitted while a group is being replicated wait in a queue; when the group in flight
completes (or immediately, if nothing is in flight) the waiting commands leave together as the
next group — one Raft entry, one round trip, one journal sync — bounded by ``max_commands`` and
``max_bytes``. With ``max_in_flight=1`` latency under light load is one round trip and under
heavy load the group size grows with the arrival rate, which is what makes PySyncObj's per-entry
cost (pickling, a Raft round trip, an fsync) affordable.

Filling a group: when the group in flight completes, the commands queued meanwhile may be only
the first of the writers it answered coming back (each needs a round trip to its client). Sent
at once they make a small group and every entry costs a round of Raft messages and a journal sync
on three members sharing two cores, so the groups shrink exactly when the machine is busiest.
So when a group completes, the next one waits until the queue holds as many commands as were
queued then plus the ones just answered, but no longer than ``fill_wait`` seconds (a sequential
writer — groups of one — never waits). Measurements: ``docs/performance.md``.

Everything here runs on the trio thread. ``send_group(commands, complete)`` hands a group to
the replication layer and must arrange for ``complete(results, error)`` to be called exactly once,
later, on the trio thread; it may raise ``KraftError`` to refuse the group at once.
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Callable
from typing import Any

import trio

from kraft.errors import ErrorCode, KraftError
from kraft.expiry import Expiry

logger = logging.getLogger(__name__)

Complete = Callable[[list[Any] | None, KraftError | None], None]
SendGroup = Callable[[list[bytes], Complete], None]


class _Waiter:
    """One submitted command: its outcome, and the task parked until it is known."""

    __slots__ = ("abandoned", "arrived", "command", "done", "error", "result", "task", "timed_out")

    def __init__(self, command: bytes, arrived: float) -> None:
        self.command = command
        self.arrived = arrived
        self.task: trio.lowlevel.Task | None = None
        self.result: Any = None
        self.error: KraftError | None = None
        self.abandoned = False
        self.done = False
        self.timed_out = False

    def finish(self) -> None:
        """The outcome is set: wake the submitting task."""
        self.done = True
        task, self.task = self.task, None
        if task is not None:
            trio.lowlevel.reschedule(task)


class _FillDue:
    """When a group waiting to fill is sent anyway (an :class:`Expiry` item)."""

    __slots__ = ("at", "done")

    def __init__(self, at: float) -> None:
        self.at = at
        self.done = False


class GroupCommitter:
    """Batches concurrent ``submit`` calls into groups sent through ``send_group``."""

    def __init__(
        self,
        send_group: SendGroup,
        *,
        max_commands: int = 1000,
        max_bytes: int = 1 << 20,
        max_in_flight: int = 1,
        fill_wait: float = 0.0,
    ) -> None:
        if max_commands < 1 or max_bytes < 1 or max_in_flight < 1 or fill_wait < 0:
            raise ValueError("group commit bounds must be positive")
        self._send_group = send_group
        self.max_commands = max_commands
        self.max_bytes = max_bytes
        self.max_in_flight = max_in_flight
        self.fill_wait = fill_wait
        self._fill_target = 1  # queued + answered when the last group completed
        self._fill_until = -math.inf  # the latest time the next group waits for
        self._fill_due: _FillDue | None = None  # the pending fill timer, if any
        self._fill_timer: Expiry[_FillDue] = Expiry(self._fill_expired, "group-commit-fill")
        self._queue: collections.deque[_Waiter] = collections.deque()
        self._in_flight = 0
        self._completions: set[Complete] = set()
        self._expiry: Expiry[_Waiter] = Expiry(self._time_out, "group-commit-expiry")
        self.groups_sent = 0
        self.commands_sent = 0
        self.largest_group = 0
        self.groups_failed = 0
        self.fill_waits = 0

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def queued(self) -> int:
        return len(self._queue)

    async def submit(self, command: bytes, timeout: float) -> Any:
        """Queue ``command``, wait for its result; ``KraftError(REQUEST_TIMED_OUT)`` after
        ``timeout`` seconds (the command may still commit if its group was already sent)."""
        return await self.wait(self.enqueue(command, timeout), timeout)

    def enqueue(self, command: bytes, timeout: float) -> _Waiter:
        """Queue ``command`` now, without yielding: commands are replicated in the order they
        are queued, so a caller that proposes batches chained on each other queues each one
        as it proposes it and waits for the outcomes later (:meth:`wait`)."""
        if len(command) > self.max_bytes:
            raise KraftError(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"command of {len(command)} bytes exceeds {self.max_bytes}",
            )
        now = trio.current_time()
        waiter = _Waiter(command, now)
        self._queue.append(waiter)
        self._pump()
        if not waiter.done:
            # parked without a cancel scope of its own (one per command was a tenth of the
            # leader's CPU at 32 in flight): the expiry task wakes it at its deadline
            self._expiry.add(waiter, now + timeout)
        return waiter

    async def wait(self, waiter: _Waiter, timeout: float) -> Any:
        """The result of a queued command (``timeout``: the one it was queued with)."""
        if waiter.done:
            await trio.lowlevel.checkpoint()
        else:
            waiter.task = trio.lowlevel.current_task()

            def abort(_: Any) -> trio.lowlevel.Abort:
                waiter.task = None  # cancelled: as before, a queued command may still be sent
                return trio.lowlevel.Abort.SUCCEEDED

            await trio.lowlevel.wait_task_rescheduled(abort)
        if waiter.timed_out:
            raise KraftError(
                ErrorCode.REQUEST_TIMED_OUT,
                f"no commit within {timeout:.3g}s; the command may still commit",
            )
        if waiter.error is not None:
            raise waiter.error
        return waiter.result

    @staticmethod
    def _time_out(waiter: _Waiter) -> None:
        waiter.abandoned = True  # if still queued, _pump drops it: it was never sent
        waiter.timed_out = True
        waiter.finish()

    def kick(self) -> None:
        """Send what is queued if a slot is free (e.g. after a leadership change)."""
        self._pump()

    def fail_in_flight(self, error: KraftError) -> None:
        """Fail the groups already handed over (their outcome is unknown: e.g. on shutdown);
        a completion arriving later is ignored."""
        for complete in list(self._completions):
            complete(None, error)

    def fail_all(self, error: KraftError) -> None:
        """Fail every queued (unsent) command."""
        while self._queue:
            waiter = self._queue.popleft()
            if not waiter.done:
                waiter.error = error
                waiter.finish()

    def _take_group(self) -> list[_Waiter]:
        group: list[_Waiter] = []
        size = 0
        while self._queue and len(group) < self.max_commands:
            waiter = self._queue[0]
            if waiter.abandoned:
                self._queue.popleft()
                continue
            if group and size + len(waiter.command) > self.max_bytes:
                break
            self._queue.popleft()
            group.append(waiter)
            size += len(waiter.command)
        return group

    def _filling(self) -> bool:
        """Whether the next group should wait for more commands (arming a timer if so)."""
        if self.fill_wait <= 0 or len(self._queue) >= min(self._fill_target, self.max_commands):
            return False
        due = self._fill_until
        if trio.current_time() >= due:
            return False
        self.fill_waits += 1
        if self._fill_due is None or self._fill_due.at > due:
            if self._fill_due is not None:
                self._fill_due.done = True  # replaced by an earlier one
            self._fill_due = _FillDue(due)
            self._fill_timer.add(self._fill_due, due)
        return True

    def _fill_expired(self, _: _FillDue) -> None:
        self._fill_due = None
        self._pump()

    def _pump(self) -> None:
        while self._in_flight < self.max_in_flight and self._queue:
            if self._filling():
                return
            group = self._take_group()
            if not group:
                return
            self._in_flight += 1
            done = False

            def complete(
                results: list[Any] | None, error: KraftError | None, group: list[_Waiter] = group
            ) -> None:
                nonlocal done
                if done:
                    logger.debug("group already completed; ignoring a late completion")
                    return
                done = True
                self._completions.discard(complete)
                self._in_flight -= 1
                # the writers answered now are likely to come back: the next group waits for them
                self._fill_target = len(self._queue) + len(group)
                self._fill_until = trio.current_time() + self.fill_wait
                self._resolve(group, results, error)
                self._pump()

            self._completions.add(complete)
            try:
                self._send_group([w.command for w in group], complete)
            except KraftError as err:
                done = True
                self._completions.discard(complete)
                self._in_flight -= 1
                self._resolve(group, None, err)
                # the same refusal would hit everything queued behind it
                self.fail_all(err)
                return
            self.groups_sent += 1
            self.commands_sent += len(group)
            self.largest_group = max(self.largest_group, len(group))

    def _resolve(
        self, group: list[_Waiter], results: list[Any] | None, error: KraftError | None
    ) -> None:
        if error is None and (results is None or len(results) != len(group)):
            error = KraftError(
                ErrorCode.UNKNOWN_SERVER_ERROR,
                f"apply returned {None if results is None else len(results)} "
                f"results for {len(group)} commands",
            )
        if error is not None:
            self.groups_failed += 1
        for i, waiter in enumerate(group):
            if waiter.done:  # timed out while its group was in flight
                continue
            if error is not None:
                waiter.error = error
            else:
                waiter.result = results[i]  # type: ignore[index]  # results is a list whenever error is None
            waiter.finish()
