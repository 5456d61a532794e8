"""Controller RPC client that follows the active controller.

:class:`ControllerClient` keeps one connection, pipelines concurrent calls over it (no
reader task: whichever caller is waiting reads for everyone; one expiry task per connection wakes
callers at their deadlines, see ``_Conn``), and retries until the call's deadline:

* ``NOT_CONTROLLER`` with a leader hint ``{leader_id, leader_host, leader_port}`` → reconnect
  to that controller and retry; without a hint (election in progress) → back off, try others.
* connection errors → back off and try the next bootstrap controller.
* ``REQUEST_TIMED_OUT`` / ``LEADER_NOT_AVAILABLE`` → retry while time remains.
* no answer within a whole ``attempt_timeout`` (a stalled or SIGSTOPped controller keeps its sockets
  open but answers nothing) → drop the connection, mark that controller *suspect* for
  ``suspect_s`` (default twice the attempt timeout of the call) and ask the next one; while suspect it is skipped when choosing a controller and
  leader hints naming it are not followed (a follower that has not yet seen the new election
  still names the stalled leader). Any answer from it clears the suspicion.

Write requests carry a ``request_id`` (uuid4) that stays the same across retries, so a write
that was committed before its answer was lost is deduplicated by the state machine.

With ``credentials`` (:class:`~kraft.rpc.auth.ClientCredentials`) every new connection first
sends ``SaslAuthenticate``; a refusal raises ``SASL_AUTHENTICATION_FAILED`` at once (no retry).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import random
import uuid
from typing import Any, cast

import trio

from kraft.errors import ErrorCode, KraftError
from kraft.expiry import Expiry
from kraft.rpc.apis import APIS
from kraft.rpc.auth import AUTH_API, ClientCredentials
from kraft.rpc.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    FrameDecoder,
    FrameError,
    encode_frame,
    write_now,
)

logger = logging.getLogger(__name__)

Address = tuple[str, int]
RETRIABLE = {ErrorCode.NOT_CONTROLLER, ErrorCode.REQUEST_TIMED_OUT, ErrorCode.LEADER_NOT_AVAILABLE}
_CONN_ERRORS = (
    OSError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    FrameError,
    ConnectionError,
)


class _ConnectionLost(Exception):
    """The connection broke while a call was outstanding."""


class _Expired(Exception):
    """The call's deadline passed while it waited for its answer."""


class _Pending:
    """One call waiting on a connection: its answer (or the connection's failure, or its
    deadline passing) and the task parked until then."""

    __slots__ = ("done", "error", "expired", "response", "task")

    def __init__(self) -> None:
        self.response: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.expired = False
        self.task: trio.lowlevel.Task | None = None
        self.done = False  # answered, failed or expired

    def settle(self) -> None:
        self.done = True
        self.wake()

    def wake(self) -> None:
        task, self.task = self.task, None
        if task is not None:
            trio.lowlevel.reschedule(task)


def _expire(waiter: _Pending) -> None:
    waiter.expired = True
    waiter.settle()


class _Conn:
    """One pipelined connection.

    Requests queue their frames in an outbox; whichever caller finds no write in progress sends
    everything queued in one write (callers woken together by one read leave together). Callers
    park until their answer arrives; if nobody is reading, the caller becomes the reader and
    dispatches every answer it sees, waking exactly the callers answered — and, when it leaves
    with its own answer, one caller still waiting, to read next.

    Deadlines: a parked caller is woken at its deadline by one expiry task (no cancel scope per
    call: at thousands of calls a second one each was a third of a client's CPU); the reader
    waits for bytes under its deadline, and a write waits only when the socket is full."""

    def __init__(self, address: Address, stream: trio.SocketStream, max_frame_bytes: int) -> None:
        self.address = address
        self.stream = stream
        self.fd = stream.socket.fileno()
        self.decoder = FrameDecoder(max_frame_bytes)
        self.max_frame_bytes = max_frame_bytes
        self.outbox: list[bytes] = []
        self.flushing = False
        self.reading = False
        self.pending: dict[int, _Pending] = {}
        self.ids = itertools.count(1)
        self.broken: BaseException | None = None
        self.expiry: Expiry[_Pending] = Expiry(_expire, "rpc-client-expiry")

    async def request(self, envelope: dict[str, Any], deadline: float = math.inf) -> dict[str, Any]:
        """Send ``envelope`` and wait for its answer until ``deadline`` (trio time): raises
        ``_Expired`` then, ``_ConnectionLost`` if the connection breaks."""
        if self.broken is not None:
            raise _ConnectionLost(str(self.broken))
        correlation_id = next(self.ids)
        envelope["correlation_id"] = correlation_id
        try:
            frame = encode_frame(envelope, self.max_frame_bytes)
        except FrameError as exc:
            raise KraftError(
                ErrorCode.MESSAGE_TOO_LARGE if "exceeds" in str(exc) else ErrorCode.INVALID_REQUEST,
                str(exc),
            ) from exc
        waiter = _Pending()
        self.pending[correlation_id] = waiter
        try:
            self.outbox.append(frame)
            if not self.flushing:
                await self._flush(deadline)
            while not waiter.done:
                if self.reading:
                    await self._park(waiter, deadline)
                else:
                    await self._read_until(waiter, deadline)
        finally:
            self.pending.pop(correlation_id, None)
            if not self.reading:  # leaving (answered, expired, cancelled): someone must read
                for other in self.pending.values():
                    if not other.done:
                        other.wake()
                        break
        if waiter.error is not None:
            raise _ConnectionLost(str(waiter.error))
        if waiter.response is None:
            raise _Expired()
        return waiter.response

    async def _park(self, waiter: _Pending, deadline: float) -> None:
        """Wait until the reader answers or wakes us, or the deadline passes."""
        waiter.task = trio.lowlevel.current_task()
        self.expiry.add(waiter, deadline)

        def abort(_: Any) -> trio.lowlevel.Abort:
            waiter.task = None
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    async def _flush(self, deadline: float) -> None:
        """Send the outbox until it is empty (frames queued meanwhile go in the next write).
        The write carries other callers' frames too: if the flushing caller is cancelled or
        times out during it, the connection is broken — a frame may be half sent — and the
        other callers retry on a new one (writes keep their request id: deduplicated)."""
        self.flushing = True
        try:
            while self.outbox and self.broken is None:
                data = self.outbox[0] if len(self.outbox) == 1 else b"".join(self.outbox)
                self.outbox.clear()
                sent = write_now(self.fd, data)
                if sent == len(data):  # let the callers woken with us queue theirs: one write
                    await trio.lowlevel.cancel_shielded_checkpoint()
                    continue
                with trio.move_on_at(deadline):
                    await self.stream.send_all(memoryview(data)[sent:])
                    continue
                self._break(
                    ConnectionError("a request's deadline passed while its connection was sending")
                )
        except _CONN_ERRORS as exc:
            self._break(exc)
        except trio.Cancelled:
            self._break(ConnectionError("a request was cancelled while its connection was sending"))
            raise
        finally:
            self.flushing = False

    async def _read_until(self, waiter: _Pending, deadline: float) -> None:
        self.reading = True
        try:
            while not waiter.done:
                try:
                    data = os.read(self.fd, 65536)
                except BlockingIOError:
                    try:
                        with trio.move_on_at(deadline) as scope:
                            await trio.lowlevel.wait_readable(self.fd)
                    except _CONN_ERRORS as exc:  # closed meanwhile
                        self._break(exc)
                        return
                    if scope.cancelled_caught:
                        _expire(waiter)
                    continue
                except _CONN_ERRORS as exc:
                    self._break(exc)
                    return
                try:
                    if not data:
                        raise ConnectionError("connection closed by the controller")
                    frames = self.decoder.feed(data)
                except _CONN_ERRORS as exc:
                    self._break(exc)
                    return
                for frame in frames:
                    # a frame without an int correlation_id matches no pending call
                    other = self.pending.get(cast(int, frame.get("correlation_id")))
                    if other is not None and not other.done:
                        other.response = frame
                        other.settle()
        finally:
            self.reading = False
            for other in self.pending.values():  # hand the reading over to one still waiting
                if not other.done and other is not waiter:
                    other.wake()
                    break

    def _break(self, exc: BaseException) -> None:
        if self.broken is None:
            self.broken = exc
        self.outbox.clear()
        for waiter in self.pending.values():
            if not waiter.done:
                waiter.error = exc
                waiter.settle()
        self.expiry.close()

    async def aclose(self) -> None:
        self._break(ConnectionError("closed"))
        with trio.CancelScope(shield=True):
            await self.stream.aclose()


class ControllerClient:
    """Calls controller RPC APIs on whichever controller is active."""

    def __init__(
        self,
        bootstrap: list[Address],
        client_id: str = "kraft-cli",
        request_timeout: float = 10.0,
        credentials: ClientCredentials | None = None,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        connect_timeout: float = 2.0,
        backoff_initial: float = 0.05,
        backoff_max: float = 1.0,
        attempt_timeout: float = 5.0,
        suspect_s: float | None = None,
    ) -> None:
        if not bootstrap:
            raise ValueError("at least one bootstrap controller is required")
        self.bootstrap = [(h, int(p)) for h, p in bootstrap]
        self.client_id = client_id
        self.request_timeout = request_timeout
        self.credentials = credentials
        self.principal: str | None = None  # as authenticated by the controller
        self.max_frame_bytes = max_frame_bytes
        self.connect_timeout = connect_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.attempt_timeout = attempt_timeout
        # None: twice the attempt timeout of the call that found it silent (short: a leader
        # that was only slow, or is elected again, is asked again soon)
        self.suspect_s = suspect_s
        self._suspect: dict[Address, float] = {}  # address -> trio time its suspicion ends
        self._conn: _Conn | None = None
        self._connect_lock = trio.Lock()
        self._hint: Address | None = None
        self._next = random.randrange(len(self.bootstrap))
        self._closed = False

    @property
    def connected_to(self) -> Address | None:
        """The controller the client is connected to, if any."""
        return self._conn.address if self._conn is not None and self._conn.broken is None else None

    def is_suspect(self, address: Address) -> bool:
        """Whether ``address`` recently left an attempt unanswered (see the module docstring)."""
        until = self._suspect.get(address)
        if until is None:
            return False
        if trio.current_time() >= until:
            del self._suspect[address]
            return False
        return True

    async def call(
        self,
        api: str,
        body: dict[str, Any],
        timeout: float | None = None,
        request_id: str | None = None,
        attempt_timeout: float | None = None,
        *,
        on_behalf_of: str | None = None,
    ) -> dict[str, Any]:
        """Call ``api`` and return the response body; raise ``KraftError`` (``.body`` holds the
        error response's body) when the answer is an error or the deadline passes. One
        controller gets ``attempt_timeout`` (default: the client's) to answer before the call
        moves on to another. ``on_behalf_of``: the principal a broker forwards for
        (kraft.rpc.authorize)."""
        if self._closed:
            raise KraftError(ErrorCode.NETWORK_EXCEPTION, "client is closed")
        spec = APIS.get(api)
        if request_id is None and spec is not None and spec.kind == "write":
            request_id = str(uuid.uuid4())
        envelope: dict[str, Any] = {
            "api": api,
            "version": 0,
            "body": body,
            "client_id": self.client_id,
        }
        if request_id is not None:
            envelope["request_id"] = request_id
        if on_behalf_of is not None:
            envelope["on_behalf_of"] = on_behalf_of
        deadline = trio.current_time() + (self.request_timeout if timeout is None else timeout)
        per_attempt = self.attempt_timeout if attempt_timeout is None else attempt_timeout
        backoff = self.backoff_initial
        last_error: KraftError | None = None
        while True:
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                break
            # only a controller silent for a whole attempt is suspect; a call that runs out of
            # its own (shorter) time leaves the connection to the calls sharing it
            full_attempt = remaining >= per_attempt
            attempt_deadline = deadline if not full_attempt else deadline - remaining + per_attempt
            conn: _Conn | None = self._conn
            try:
                if conn is None or conn.broken is not None:  # connecting: under the deadline
                    conn = None
                    with trio.move_on_at(attempt_deadline):
                        conn = await self._connection(attempt_deadline - trio.current_time())
                    if conn is None:  # connecting took the whole attempt: the next one
                        self._next += 1
                        continue
                response = await conn.request(dict(envelope), attempt_deadline)
            except _Expired:
                assert conn is not None
                if not full_attempt:
                    break
                await self._suspect_and_drop(conn, api, per_attempt)
                last_error = KraftError(
                    ErrorCode.REQUEST_TIMED_OUT,
                    f"controller {conn.address[0]}:{conn.address[1]} did not answer "
                    f"within {per_attempt:g}s",
                )
                continue
            except (_ConnectionLost, trio.TooSlowError, *_CONN_ERRORS) as exc:
                logger.debug("%s: connection problem: %r", api, exc)
                last_error = KraftError(ErrorCode.NETWORK_EXCEPTION, str(exc) or repr(exc))
                with trio.move_on_at(deadline):
                    await self._drop_connection(conn, rotate=True)
                    await trio.sleep(min(backoff, max(0.0, deadline - trio.current_time())))
                backoff = min(backoff * 2, self.backoff_max)
                continue
            self._suspect.pop(conn.address, None)  # it answered
            code = response.get("error_code", 0)
            if code == 0:
                result = response.get("body")
                return result if isinstance(result, dict) else {}
            err = _error_from(response)
            if err.code not in RETRIABLE:
                raise err
            last_error = err
            with trio.move_on_at(deadline):
                if err.code == ErrorCode.NOT_CONTROLLER and self._follow_hint(
                    err.body, conn.address
                ):
                    await self._drop_connection(conn, rotate=False)
                    continue
                if err.code == ErrorCode.NOT_CONTROLLER:
                    await self._drop_connection(conn, rotate=True)
                await trio.sleep(min(backoff, max(0.0, deadline - trio.current_time())))
            backoff = min(backoff * 2, self.backoff_max)
        if last_error is not None and last_error.code not in (
            ErrorCode.NETWORK_EXCEPTION,
            ErrorCode.REQUEST_TIMED_OUT,
        ):
            raise last_error
        raise KraftError(
            ErrorCode.REQUEST_TIMED_OUT,
            f"{api}: no answer from a controller before the deadline"
            + (f" (last error: {last_error.message})" if last_error else ""),
        )

    async def _suspect_and_drop(self, conn: _Conn, api: str, per_attempt: float) -> None:
        """``conn``'s controller left an attempt unanswered: suspect it, ask another."""
        logger.info(
            "%s: no answer from controller %s:%d within the attempt timeout; trying another",
            api,
            *conn.address,
        )
        span = 2 * per_attempt if self.suspect_s is None else self.suspect_s
        self._suspect[conn.address] = trio.current_time() + max(span, 0.0)
        with trio.CancelScope(shield=True):
            await self._drop_connection(conn, rotate=True)

    def _follow_hint(self, body: dict[str, Any], current: Address) -> bool:
        host, port = body.get("leader_host"), body.get("leader_port")
        if (
            isinstance(host, str)
            and host
            and isinstance(port, int)
            and port > 0
            and (host, port) != current
            and not self.is_suspect((host, port))
        ):
            self._hint = (host, port)
            return True
        return False

    async def _connection(self, remaining: float) -> _Conn:
        conn = self._conn
        if conn is not None and conn.broken is None:  # the common case: no lock round trip
            return conn
        async with self._connect_lock:
            if self._conn is not None and self._conn.broken is None:
                return self._conn
            if self._conn is not None:
                await self._conn.aclose()
                self._conn = None
            address = self._pick_address()
            with trio.fail_after(min(self.connect_timeout, max(remaining, 0.001))):
                stream = await trio.open_tcp_stream(*address)
            conn = _Conn(address, stream, self.max_frame_bytes)
            if self.credentials is not None:
                await self._authenticate(conn)
            self._conn = conn
            return conn

    def _pick_address(self) -> Address:
        """The leader hint, else the next bootstrap controller that is not suspect (all
        suspect: the one whose suspicion ends first)."""
        hint, self._hint = self._hint, None
        if hint is not None and not self.is_suspect(hint):
            return hint
        n = len(self.bootstrap)
        for i in range(n):
            address = self.bootstrap[(self._next + i) % n]
            if not self.is_suspect(address):
                self._next += i
                return address
        return min(self.bootstrap, key=lambda a: self._suspect.get(a, 0.0))

    async def _authenticate(self, conn: _Conn) -> None:
        """Send the connection's SaslAuthenticate; raise KraftError if the controller refuses."""
        assert self.credentials is not None
        try:
            response = await conn.request(
                {
                    "api": AUTH_API,
                    "version": 0,
                    "client_id": self.client_id,
                    "body": self.credentials.handshake_body(),
                }
            )
        except BaseException:
            await conn.aclose()
            raise
        if response.get("error_code", 0):
            await conn.aclose()
            raise _error_from(response)
        principal = (response.get("body") or {}).get("principal")
        self.principal = principal if isinstance(principal, str) else None

    async def _drop_connection(self, conn: _Conn | None, rotate: bool) -> None:
        """Close ``conn`` if it is still current (None: just rotate after a failed connect)."""
        async with self._connect_lock:
            if conn is not None and self._conn is conn:
                await conn.aclose()
                self._conn = None
            if rotate and (conn is None or conn.address in self.bootstrap):
                self._next += 1

    async def aclose(self) -> None:
        """Close the connection; later calls fail."""
        self._closed = True
        if self._conn is not None:
            await self._drop_connection(self._conn, rotate=False)


def _error_from(response: dict[str, Any]) -> KraftError:
    code = response.get("error_code", ErrorCode.UNKNOWN_SERVER_ERROR)
    try:
        err_code = ErrorCode(code)
    except ValueError:
        err_code = ErrorCode.UNKNOWN_SERVER_ERROR
    body = response.get("body")
    return KraftError(
        err_code, str(response.get("error_message") or ""), body if isinstance(body, dict) else None
    )


def call_sync(
    bootstrap: list[Address],
    api: str,
    body: dict[str, Any],
    timeout: float = 10.0,
    **client_kwargs: Any,
) -> dict[str, Any]:
    """Run one call in a fresh trio run (for the CLI)."""

    async def _main() -> dict[str, Any]:
        client = ControllerClient(bootstrap, request_timeout=timeout, **client_kwargs)
        try:
            return await client.call(api, body, timeout=timeout)
        finally:
            await client.aclose()

    return trio.run(_main)
