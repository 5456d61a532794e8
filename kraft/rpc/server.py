"""Controller RPC server (trio): frames in, handler, frames out.

Per connection the server reads frames, checks the envelope ``{api, version, correlation_id,
body}`` (+ optional ``client_id``, ``request_id``): a known API and a map body
(:func:`kraft.rpc.apis.check_request`; the handler's dispatch checks the body's fields), runs
the handler — several requests of one connection concurrently — and writes ``{correlation_id,
error_code, error_message, body}`` in request order. A garbage or oversized frame, a frame left incomplete or a response left unread
for longer than ``io_timeout`` (slowloris), or ``idle_timeout`` without a request, closes that
connection only; connections beyond ``max_connections``, or beyond ``max_connections_per_ip`` from
one client address (so one host cannot lock every other client out), are closed at once, and a
connection whose
incomplete frame takes the bytes held by all connections over ``max_buffered_bytes`` is closed
(so memory stays bounded however many clients upload large frames slowly).

With a :class:`~kraft.rpc.auth.CredentialStore` the first request of a connection must be
``SaslAuthenticate {mechanism: "PLAIN", username, password}`` (answered ``{principal}``), sent
within ``io_timeout``; anything else, or a wrong password, is answered
``SASL_AUTHENTICATION_FAILED`` and the connection is closed without running a handler. The
authenticated principal is the one every later request of the connection carries, except
that a broker principal may name the Kafka client it forwards for (``on_behalf_of``) and only a
broker principal may call the broker APIs (:mod:`kraft.rpc.authorize`).
"""

from __future__ import annotations

import collections
import logging
import math
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

import trio

from kraft.errors import ErrorCode, KraftError
from kraft.rpc.apis import check_request
from kraft.rpc.auth import AUTH_API, MECHANISM, CredentialStore
from kraft.rpc.authorize import DEFAULT_BROKER_PRINCIPALS, effective_principal
from kraft.rpc.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    FrameDecoder,
    FrameError,
    Packed,
    encode_answer,
    encode_frame,
    write_now,
)

logger = logging.getLogger(__name__)

ANONYMOUS = "User:ANONYMOUS"


@dataclass(frozen=True)
class RequestContext:
    """Who sent a request: peer ``host:port``, authenticated principal, client id, and the
    write's idempotency key (``request_id``, None for reads) plus the envelope's API version."""

    peer: str
    principal: str
    client_id: str
    request_id: str | None = None
    api_version: int = 0
    correlation_id: int = 0
    via: str = ""  # the broker principal that forwarded the request (on_behalf_of), if any


Handler = Callable[[str, dict[str, Any], RequestContext], Awaitable[dict[str, Any] | Packed]]


class _Slot:
    """One request's place in the per-connection response order."""

    __slots__ = ("done", "frame")

    def __init__(self) -> None:
        self.done = False
        self.frame: bytes = b""


class _Answers:
    """A connection's answers, sent in request order by whichever task finishes the oldest one.

    The task that answers the oldest pending request sends it, with every answer already done
    behind it, in one write (a committed group answers many pipelined requests at once); a task
    finishing a later one leaves it for that sender. No writer task: an answer leaves without
    another trio scheduling round."""

    def __init__(self, stream: trio.SocketStream, io_timeout: float, max_pending: int) -> None:
        self._stream = stream
        self._fd = stream.socket.fileno()  # non-blocking: a write takes what fits, never waits
        self._io_timeout = io_timeout
        self._max_pending = max_pending
        self._pending: collections.deque[_Slot] = collections.deque()
        self._sending = False
        self._room = trio.Event()

    async def new_slot(self) -> _Slot:
        """A place for the next request's answer; waits while ``max_pending`` are unanswered."""
        while len(self._pending) >= self._max_pending:
            self._room = trio.Event()
            await self._room.wait()
        slot = _Slot()
        self._pending.append(slot)
        return slot

    async def done(self, slot: _Slot, frame: bytes) -> None:
        """``slot`` is answered with ``frame``; send what is in order to go (TooSlowError when
        the peer does not take it within the io timeout)."""
        slot.frame = frame
        slot.done = True
        if self._sending:
            return  # the sending task picks it up after its current write
        pending = self._pending
        self._sending = True
        try:
            while pending and pending[0].done:
                frames = [pending.popleft().frame]
                while pending and pending[0].done:
                    frames.append(pending.popleft().frame)
                self._room.set()
                data = frames[0] if len(frames) == 1 else b"".join(frames)
                sent = write_now(self._fd, data)
                if sent == len(data):  # answers finished meanwhile go together in the next write
                    await trio.lowlevel.cancel_shielded_checkpoint()
                else:
                    with trio.move_on_after(self._io_timeout) as scope:
                        await self._stream.send_all(memoryview(data)[sent:])
                    if scope.cancelled_caught:
                        raise trio.TooSlowError(f"an answer took over {self._io_timeout}s to send")
        finally:
            self._sending = False


class RpcServer:
    """Serve the controller RPC on ``host:port`` (0 = any free port; see ``serve``)."""

    def __init__(
        self,
        host: str,
        port: int,
        handler: Handler,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        credentials: CredentialStore | None = None,
        max_connections: int = 1024,
        max_in_flight_per_connection: int = 64,
        io_timeout: float = 10.0,
        idle_timeout: float = 600.0,
        max_buffered_bytes: int = 256 * 1024 * 1024,
        max_connections_per_ip: int = 1000,
        broker_principals: frozenset[str] = DEFAULT_BROKER_PRINCIPALS,
    ) -> None:
        self.host = host
        self.port = port
        self.handler = handler
        self.max_frame_bytes = max_frame_bytes
        self.credentials = credentials
        self.max_connections = max_connections
        self.max_connections_per_ip = max_connections_per_ip
        self.broker_principals = broker_principals
        self._per_ip: collections.Counter[str] = collections.Counter()
        self.refused_per_ip = 0
        self.max_in_flight = max_in_flight_per_connection
        self.io_timeout = io_timeout
        self.idle_timeout = idle_timeout
        self.connections = 0
        self.bound_port: int | None = None
        self.closed_for_garbage = 0
        self.auth_failures = 0
        self.max_buffered_bytes = max_buffered_bytes
        self.buffered_bytes = 0  # incomplete frames held by all connections
        self.closed_for_memory = 0
        # Password hashing is deliberately slow: at most two checks at a time, off the event loop.
        self._hash_limiter = trio.CapacityLimiter(2)

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Bind, report the actual port through ``task_status``, serve until cancelled."""
        listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        self.bound_port = listeners[0].socket.getsockname()[1]
        logger.info("controller RPC listening on %s:%d", self.host, self.bound_port)
        task_status.started(self.bound_port)
        await trio.serve_listeners(self._on_connection, listeners)

    async def _on_connection(self, stream: trio.SocketStream) -> None:
        try:
            peer_addr = stream.socket.getpeername()
            host, peer = str(peer_addr[0]), f"{peer_addr[0]}:{peer_addr[1]}"
        except OSError:
            host = peer = "?"
        if self.connections >= self.max_connections:
            logger.warning(
                "refusing connection from %s: %d connections open", peer, self.connections
            )
            await stream.aclose()
            return
        if self._per_ip[host] >= self.max_connections_per_ip:
            self.refused_per_ip += 1
            if self.refused_per_ip % 100 == 1:  # a flood must not flood the log too
                logger.warning(
                    "refusing connection from %s: %d open from that address "
                    "(max.connections.per.ip); %d refused so far",
                    peer,
                    self._per_ip[host],
                    self.refused_per_ip,
                )
            await stream.aclose()
            return
        self._per_ip[host] += 1
        self.connections += 1
        try:
            await self._run_connection(stream, peer)
        except* (
            trio.BrokenResourceError,
            trio.ClosedResourceError,
            trio.TooSlowError,
            OSError,
        ) as exc:
            # except*: the connection's nursery wraps a reset peer in an ExceptionGroup, and
            # a plain except would let it escape and stop the whole RPC server.
            logger.debug("connection %s ended: %r", peer, exc)
        finally:
            self.connections -= 1
            self._per_ip[host] -= 1
            if not self._per_ip[host]:
                del self._per_ip[host]
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _run_connection(self, stream: trio.SocketStream, peer: str) -> None:
        answers = _Answers(stream, self.io_timeout, self.max_in_flight)
        async with trio.open_nursery() as nursery:
            # when the reader ends, the answer tasks still running finish and send
            await self._reader(stream, peer, nursery, answers)

    async def _reader(
        self, stream: trio.SocketStream, peer: str, nursery: trio.Nursery, answers: _Answers
    ) -> None:
        decoder = FrameDecoder(self.max_frame_bytes)
        principal = ANONYMOUS if self.credentials is None else None
        start = trio.current_time()
        idle_deadline = start + (self.idle_timeout if principal else self.io_timeout)
        frame_deadline = math.inf
        held = 0  # this connection's bytes in self.buffered_bytes
        fd = stream.socket.fileno()
        try:
            while True:
                deadline = min(idle_deadline, frame_deadline)
                try:  # bytes already there are read without a timed wait (a cancel scope each)
                    data = os.read(fd, 65536)
                    late = trio.current_time() >= deadline
                    await trio.lowlevel.checkpoint()  # a busy peer must not starve the others
                except BlockingIOError:
                    with trio.move_on_at(deadline) as scope:
                        data = await stream.receive_some(65536)
                    late = scope.cancelled_caught
                if late:
                    logger.info(
                        "closing %s: %s",
                        peer,
                        "incomplete frame timed out"
                        if frame_deadline <= idle_deadline
                        else "idle"
                        if principal
                        else "not authenticated in time",
                    )
                    nursery.cancel_scope.cancel()
                    return
                if not data:
                    return
                try:
                    messages = decoder.feed(data)
                except FrameError as exc:
                    self.closed_for_garbage += 1
                    logger.warning("closing %s: %s", peer, exc)
                    nursery.cancel_scope.cancel()
                    return
                self.buffered_bytes += decoder.buffered - held
                held = decoder.buffered
                if held and self.buffered_bytes > self.max_buffered_bytes:
                    self.closed_for_memory += 1
                    logger.warning(
                        "closing %s: incomplete frames of all connections hold %d bytes, over "
                        "the limit of %d",
                        peer,
                        self.buffered_bytes,
                        self.max_buffered_bytes,
                    )
                    nursery.cancel_scope.cancel()
                    return
                now = trio.current_time()
                if decoder.buffered:
                    if frame_deadline == math.inf:
                        frame_deadline = now + self.io_timeout
                else:
                    frame_deadline = math.inf
                if messages and principal:
                    idle_deadline = now + self.idle_timeout
                for message in messages:
                    slot = await answers.new_slot()
                    if principal is None:
                        principal, frame = await self._authenticate(message, peer)
                        await answers.done(slot, frame)
                        if principal is None:
                            return  # the refusal is sent: the connection closes
                        idle_deadline = trio.current_time() + self.idle_timeout
                    else:
                        nursery.start_soon(self._answer, message, peer, principal, answers, slot)
        finally:
            self.buffered_bytes -= held

    async def _authenticate(self, message: dict[str, Any], peer: str) -> tuple[str | None, bytes]:
        """Answer a connection's first request: the principal (None: refused) and the answer."""
        assert self.credentials is not None
        correlation_id = _correlation_id(message)
        body = message.get("body")
        principal = None
        if message.get("api") != AUTH_API:
            reason = f"authentication required: send {AUTH_API} first"
        elif not isinstance(body, dict) or body.get("mechanism") != MECHANISM:
            reason = f"unsupported mechanism: only {MECHANISM} is enabled"
        else:
            username, password = body.get("username"), body.get("password")
            async with self._hash_limiter:
                principal = await trio.to_thread.run_sync(
                    self.credentials.verify, username, password
                )
            reason = "invalid username or password"
        if principal is None:
            self.auth_failures += 1
            logger.warning("refusing %s: %s", peer, reason)
            return None, encode_frame(
                {
                    "correlation_id": correlation_id,
                    "error_code": int(ErrorCode.SASL_AUTHENTICATION_FAILED),
                    "error_message": reason,
                    "body": {},
                }
            )
        logger.info("%s authenticated as %s", peer, principal)
        return principal, encode_frame(
            {
                "correlation_id": correlation_id,
                "error_code": 0,
                "error_message": "",
                "body": {"principal": principal},
            }
        )

    async def _answer(
        self, message: dict[str, Any], peer: str, principal: str, answers: _Answers, slot: _Slot
    ) -> None:
        correlation_id = _correlation_id(message)
        body: dict[str, Any] | Packed | None = None
        try:
            body = await self._dispatch(message, peer, principal, correlation_id)
        except KraftError as err:
            response = {"correlation_id": correlation_id, **err.to_response()}
        except Exception:
            logger.exception("handler failed for %s from %s", message.get("api"), peer)
            response = {
                "correlation_id": correlation_id,
                "error_code": int(ErrorCode.UNKNOWN_SERVER_ERROR),
                "error_message": "internal error",
                "body": {},
            }
        try:
            frame = encode_frame(response) if body is None else encode_answer(correlation_id, body)
        except Exception:
            logger.exception("cannot encode the response to %s from %s", message.get("api"), peer)
            frame = encode_frame(
                {
                    "correlation_id": correlation_id,
                    "error_code": int(ErrorCode.UNKNOWN_SERVER_ERROR),
                    "error_message": "unencodable response",
                    "body": {},
                }
            )
        await answers.done(slot, frame)

    async def _dispatch(
        self, message: dict[str, Any], peer: str, principal: str, correlation_id: int
    ) -> dict[str, Any] | Packed:
        api = message.get("api")
        version = message.get("version", 0)
        if correlation_id < 0:
            raise KraftError(ErrorCode.INVALID_REQUEST, "correlation_id must be a non-negative int")
        if not isinstance(api, str):
            raise KraftError(ErrorCode.INVALID_REQUEST, "api must be a string")
        if not isinstance(version, int) or isinstance(version, bool):
            raise KraftError(ErrorCode.INVALID_REQUEST, "version must be an int")
        if api == AUTH_API:
            raise KraftError(
                ErrorCode.ILLEGAL_SASL_STATE,
                "already authenticated"
                if self.credentials is not None
                else "authentication is not enabled on this controller",
            )
        body = message.get("body")
        check_request(api, body)
        client_id = message.get("client_id") or ""
        request_id = message.get("request_id")
        if not isinstance(client_id, str) or (
            request_id is not None and not isinstance(request_id, str)
        ):
            raise KraftError(ErrorCode.INVALID_REQUEST, "client_id and request_id must be strings")
        acting = effective_principal(
            api,
            principal,
            message.get("on_behalf_of"),
            auth_enabled=self.credentials is not None,
            broker_principals=self.broker_principals,
        )
        ctx = RequestContext(
            peer=peer,
            principal=acting,
            via=principal if acting != principal else "",
            client_id=client_id,
            request_id=request_id,
            api_version=version,
            correlation_id=correlation_id,
        )
        result = await self.handler(api, cast(dict[str, Any], body), ctx)  # validated above
        if result is None:
            return {}
        if not isinstance(result, (dict, Packed)):
            raise TypeError(f"handler returned {type(result).__name__}, not a dict or Packed")
        return result


def _correlation_id(message: dict[str, Any]) -> int:
    correlation_id = message.get("correlation_id")
    if not isinstance(correlation_id, int) or isinstance(correlation_id, bool):
        return -1
    return correlation_id
