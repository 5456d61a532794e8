"""The broker's Kafka protocol listener (trio): ApiVersions and Metadata, answered from the image,
FindCoordinator (:mod:`broker.coordinator.find_coordinator`; with :meth:`KafkaListener.serve_groups`,
the group APIs of :mod:`broker.coordinator.group.api`),
plus whatever APIs an :class:`AdminHandler` serves (merged into ApiVersions and dispatched to it).

Given a :class:`~broker.replica.replica_manager.ReplicaManager` (:meth:`KafkaListener.serve_data`) it also serves the data plane: Produce,
Fetch, ListOffsets and OffsetForLeaderEpoch (:mod:`broker.protocol.produce`, :mod:`broker.protocol.fetch`).

Per connection, requests are read and handled in order; a handler may answer later (a
:class:`~broker.protocol.kafka_codec.Deferred`: produce purgatory, long-polling fetch), and a writer task
sends the responses strictly in request order. So pipelined produce requests are all appended
at once while their acknowledgements wait for replication, and a long-polling Fetch holds up
only its own connection. A garbage, oversized or truncated frame, an undecodable
request or an API the broker does not serve closes that connection only (as Kafka does);
trailing bytes after a request body and unknown tagged fields are ignored. ApiVersions with a
version we do not know is answered Kafka's way: ApiVersions v0 carrying UNSUPPORTED_VERSION and
our ranges, so the client retries with one we support.

A :class:`~broker.protocol.kafka_security.ListenerSecurity` adds TLS (an ``SSLListener`` around the TCP
listener) and SASL/PLAIN (a :class:`~broker.protocol.kafka_security.SaslSession` per connection: nothing
but ApiVersions, SaslHandshake and SaslAuthenticate until it has authenticated).
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import struct
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, Protocol

import trio
from kio.schema.errors import ErrorCode

from broker.coordinator.find_coordinator import (
    API_FIND_COORDINATOR,
    FIND_COORDINATOR_VERSIONS,
    FindCoordinator,
    handle_find_coordinator,
)
from broker.coordinator.producer_id_manager import ProducerIdManager
from broker.metadata.metadata_cache import MetadataCache
from broker.protocol.data_codec import (
    API_LIST_OFFSETS,
    API_OFFSET_FOR_LEADER_EPOCH,
    FETCH_VERSIONS,
    LIST_OFFSETS_VERSIONS,
    OFFSET_FOR_LEADER_EPOCH_VERSIONS,
    PRODUCE_VERSIONS,
)
from broker.protocol.delete_records import (
    API_DELETE_RECORDS,
    DELETE_RECORDS_VERSIONS,
    DeleteRecordsHandler,
)
from broker.protocol.fetch import FetchHandler
from broker.protocol.fetch_session import FetchSessionCache
from broker.protocol.init_producer_id import (
    API_INIT_PRODUCER_ID,
    INIT_PRODUCER_ID_VERSIONS,
    InitProducerIdHandler,
)
from broker.protocol.kafka_codec import (
    API_API_VERSIONS,
    API_FETCH,
    API_METADATA,
    API_PRODUCE,
    SUPPORTED,
    DecodeError,
    Deferred,
    Reader,
    RequestHeader,
    build,
    encode_body,
    frame_response,
    read_header,
    read_metadata_request,
    response_class,
)
from broker.protocol.kafka_security import (
    SASL_APIS,
    ListenerSecurity,
    SaslClose,
    SaslSession,
    tls_principal,
)
from broker.protocol.produce import MESSAGE_MAX_BYTES, ProduceHandler
from broker.replica.replica_manager import ReplicaManager

log = logging.getLogger(__name__)
MAX_REQUEST_BYTES = 104_857_600  # Kafka's socket.request.max.bytes
MAX_IN_FLIGHT = 100  # requests read ahead of their responses, per connection
SASL_SERVER_MAX_RECEIVE_SIZE = 524_288  # Kafka's sasl.server.max.receive.size
REPLICATION_APIS = frozenset({API_FETCH, API_OFFSET_FOR_LEADER_EPOCH})


class _CloseConnection(Exception):
    """Internal: stop serving this connection."""


class _ReadWatch:
    """A connection's read deadline, enforced by the listener's reaper task: a cancel scope per
    socket read costs more than the rest of reading a request (trio registers and unregisters
    its deadline each time), so a read only stores its deadline and the reaper cancels
    ``scope`` once it has passed. ``deadline`` is finite only while the connection's reader
    waits in a read, so the reaper never interrupts a request being handled."""

    __slots__ = ("deadline", "scope", "why")

    def __init__(self, scope: trio.CancelScope) -> None:
        self.scope = scope
        self.deadline = math.inf
        self.why = ""


Handler = Callable[[RequestHeader, Reader], Awaitable[bytes | Deferred | None]]
AutoCreate = Callable[[RequestHeader, list[str]], Awaitable[None]]


class AdminHandler(Protocol):
    """Serves extra Kafka APIs (e.g. admin APIs forwarded to the controller) on the listener."""

    def api_ranges(self) -> dict[int, tuple[int, int]]:
        """API key -> (min version, max version) this handler answers."""
        ...

    async def handle(self, header: RequestHeader, reader: Reader, principal: str) -> bytes:
        """The full framed response to one request from ``principal`` (the connection's
        authenticated principal, ``User:ANONYMOUS`` if none); may raise ``DecodeError``."""
        ...


class GroupHandler(Protocol):
    """Serves the group coordinator APIs; unlike :class:`AdminHandler` it needs no principal."""

    def api_ranges(self) -> dict[int, tuple[int, int]]:
        """API key -> (min version, max version) this handler answers."""
        ...

    async def handle(self, header: RequestHeader, reader: Reader) -> bytes:
        """The full framed response to one request; may raise ``DecodeError``."""
        ...


class KafkaListener:
    """Serves Kafka clients on ``host:port`` from a :class:`MetadataCache`."""

    def __init__(
        self,
        cache: MetadataCache,
        host: str,
        port: int,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        *,
        admin: AdminHandler | None = None,
        security: ListenerSecurity | None = None,
        idle_timeout_s: float = 600.0,
        read_timeout_s: float = 30.0,
        max_connections: int = 10_000,
        auto_create: AutoCreate | None = None,
        max_connections_per_ip: int = 1000,
        max_preauth_bytes: int = SASL_SERVER_MAX_RECEIVE_SIZE,
        preauth_timeout_s: float = 10.0,
        replication_only: frozenset[str] | None = None,
    ) -> None:
        self.cache = cache
        # replication.only.listeners: serve followers only (see _replication_refusal); the set
        # holds the principals allowed when the listener authenticates its clients
        self.replication_only = replication_only
        self.auto_create = auto_create  # auto.create.topics.enable: Metadata creates topics
        self.max_connections_per_ip = max_connections_per_ip
        self._per_ip: collections.Counter[str] = collections.Counter()
        self.refused_per_ip = 0
        # SASL listeners, before authentication: a frame announcing more than this is refused
        # before it is read, and the login must be done within preauth_timeout_s
        self.max_preauth_bytes = max_preauth_bytes
        self.preauth_timeout_s = preauth_timeout_s
        self.idle_timeout_s = idle_timeout_s  # no request started for this long: close
        self.read_timeout_s = read_timeout_s  # a started request must arrive whole within this
        self.max_connections = max_connections
        self.connections = 0
        self.security = security or ListenerSecurity()
        self.host = host
        self.port = port
        self.max_request_bytes = max_request_bytes
        self.bound_port: int | None = None
        self._watches: set[_ReadWatch] = set()  # connections' read deadlines (see _reap)
        self._reaping = False
        self._handlers: dict[int, Handler] = {
            API_API_VERSIONS: self._api_versions,
            API_METADATA: self._metadata,
            API_FIND_COORDINATOR: functools.partial(
                handle_find_coordinator, FindCoordinator(cache, None)
            ),
        }
        self._ranges: dict[int, tuple[int, int]] = {
            **SUPPORTED,
            API_FIND_COORDINATOR: FIND_COORDINATOR_VERSIONS,
        }
        if self.security.sasl:
            self._ranges.update(SASL_APIS)  # answered per connection by its SaslSession
        self._admin = admin
        self._admin_keys: frozenset[int] = frozenset()
        if admin is not None:
            for key, span in admin.api_ranges().items():
                if key in self._handlers:
                    raise ValueError(f"admin handler claims API {key}, which the listener serves")
                self._ranges[key] = span
            self._admin_keys = frozenset(admin.api_ranges())

    def serve_data(
        self,
        replicas: ReplicaManager,
        *,
        message_max_bytes: int = MESSAGE_MAX_BYTES,
        producer_ids: ProducerIdManager | None = None,
        fetch_sessions: FetchSessionCache | None = None,
    ) -> None:
        """Also serve Produce, Fetch, ListOffsets and OffsetForLeaderEpoch from ``replicas``,
        and InitProducerId given ``producer_ids``; fetch sessions live in ``fetch_sessions``
        (one cache for all of a broker's listeners)."""
        produce = ProduceHandler(replicas, message_max_bytes)
        fetch = FetchHandler(replicas, fetch_sessions)
        self._ranges[API_DELETE_RECORDS] = DELETE_RECORDS_VERSIONS
        self._handlers[API_DELETE_RECORDS] = DeleteRecordsHandler(replicas).delete_records
        if producer_ids is not None:
            self._ranges[API_INIT_PRODUCER_ID] = INIT_PRODUCER_ID_VERSIONS
            self._handlers[API_INIT_PRODUCER_ID] = InitProducerIdHandler(
                producer_ids
            ).init_producer_id
        for key, span, handler in (
            (API_PRODUCE, PRODUCE_VERSIONS, produce.produce),
            (API_FETCH, FETCH_VERSIONS, fetch.fetch),
            (API_LIST_OFFSETS, LIST_OFFSETS_VERSIONS, fetch.list_offsets),
            (
                API_OFFSET_FOR_LEADER_EPOCH,
                OFFSET_FOR_LEADER_EPOCH_VERSIONS,
                fetch.offset_for_leader_epoch,
            ),
        ):
            self._ranges[key] = span
            self._handlers[key] = handler

    def serve_txn(self, txn: GroupHandler) -> None:
        """Also serve the transaction APIs from ``txn`` (InitProducerId included: call after
        :meth:`serve_data`)."""
        for key, span in txn.api_ranges().items():
            self._ranges[key] = span
            self._handlers[key] = _deferring(txn.handle)

    def serve_groups(self, groups: GroupHandler) -> None:
        """Also serve the group coordinator APIs (FindCoordinator included) from ``groups``."""
        for key, span in groups.api_ranges().items():
            self._ranges[key] = span
            self._handlers[key] = _deferring(groups.handle)

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled; ``task_status.started`` gets the bound port."""
        listeners: list[Any] = await trio.open_tcp_listeners(self.port, host=self.host)
        self.bound_port = listeners[0].socket.getsockname()[1]
        if self.security.ssl_context is not None:
            listeners = [
                trio.SSLListener(lst, self.security.ssl_context, https_compatible=False)
                for lst in listeners
            ]
        log.info("Kafka listener on %s:%d (%s)", self.host, self.bound_port, self.security.protocol)
        task_status.started(self.bound_port)
        async with trio.open_nursery() as nursery:
            self._reaping = True
            nursery.start_soon(self._reap)
            await trio.serve_listeners(self._connection, listeners)

    def _reap_interval(self) -> float:
        """How often :meth:`_reap` looks: a tenth of the shortest read timeout, within
        [10 ms, 1 s] (so a timeout fires at most that late)."""
        shortest = min(self.idle_timeout_s, self.read_timeout_s, self.preauth_timeout_s)
        return min(1.0, max(0.01, shortest / 10))

    async def _reap(self) -> None:
        """Close the connections whose reader waits past its deadline (idle, a request coming
        too slowly, no login in time), until cancelled."""
        try:
            while True:
                await trio.sleep(self._reap_interval())
                now = trio.current_time()
                for watch in list(self._watches):
                    if watch.deadline <= now:
                        watch.scope.cancel()
        finally:
            self._reaping = False

    async def _connection(self, stream: trio.SocketStream) -> None:
        host = _peer(stream).rpartition(":")[0]
        if self.connections >= self.max_connections:
            log.warning(
                "Kafka listener: refusing a connection from %s: %d open (max.connections)",
                _peer(stream),
                self.connections,
            )
            await stream.aclose()
            return
        if self._per_ip[host] >= self.max_connections_per_ip:
            self.refused_per_ip += 1
            if self.refused_per_ip % 100 == 1:  # a flood must not flood the log too
                log.warning(
                    "Kafka listener: refusing a connection from %s: %d open from it "
                    "(max.connections.per.ip); %d refused so far",
                    host,
                    self._per_ip[host],
                    self.refused_per_ip,
                )
            await stream.aclose()
            return
        self.connections += 1
        self._per_ip[host] += 1
        try:
            await self._serve_connection(stream)
        finally:
            self.connections -= 1
            self._per_ip[host] -= 1
            if not self._per_ip[host]:
                del self._per_ip[host]

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        peer = _peer(stream)
        session = SaslSession(self.security.users) if self.security.users is not None else None
        buf = bytearray()
        login_by = trio.current_time() + self.preauth_timeout_s if session is not None else None
        send, receive = trio.open_memory_channel[bytes | Deferred | None](MAX_IN_FLIGHT)
        async with stream, trio.open_nursery() as nursery:
            nursery.start_soon(self._write_responses, stream, receive, peer, nursery.cancel_scope)
            async with send:
                try:
                    with trio.CancelScope() as reading:
                        watch = _ReadWatch(reading) if self._reaping else None
                        if watch is not None:
                            self._watches.add(watch)
                        try:
                            while True:
                                preauth = session is not None and not session.authenticated
                                frame = await self._read_frame(
                                    stream, buf, peer, login_by if preauth else None, watch
                                )
                                if frame is None:
                                    return  # earlier requests are still answered, then it closes
                                await send.send(await self._handle(frame, peer, session, stream))
                        finally:
                            if watch is not None:
                                self._watches.discard(watch)
                    if reading.cancelled_caught and watch is not None:
                        log.warning("Kafka connection from %s: %s; closing", peer, watch.why)
                except _CloseConnection:
                    pass
                except SaslClose as e:  # answer (e.g. SASL_AUTHENTICATION_FAILED), then close
                    log.warning("Kafka connection from %s: %s; closing", peer, e)
                    if e.response is not None:
                        await send.send(e.response)
                except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
                    log.debug("Kafka connection from %s lost", peer)
                    nursery.cancel_scope.cancel()

    @staticmethod
    async def _write_responses(
        stream: trio.SocketStream,
        receive: trio.MemoryReceiveChannel[bytes | Deferred | None],
        peer: str,
        scope: trio.CancelScope,
    ) -> None:
        """Send responses in request order; on a failure, stop the whole connection."""
        try:
            async with receive:
                async for item in receive:
                    if isinstance(item, Deferred):
                        item = await item.wait()
                    if item is not None:
                        await stream.send_all(item)
        except DecodeError as e:
            log.warning("Kafka connection from %s: undecodable request (%s); closing", peer, e)
            scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
            log.debug("Kafka connection from %s lost", peer)  # the client went away: not a bug
            scope.cancel()
        except Exception:  # a bug in a deferred answer closes this connection only
            log.exception("Kafka connection from %s: answering a request failed; closing", peer)
            scope.cancel()

    async def _receive(
        self,
        stream: trio.SocketStream,
        max_bytes: int,
        deadline: float,
        peer: str,
        why: str,
        watch: _ReadWatch | None = None,
    ) -> bytes:
        if watch is not None:  # the reaper enforces the deadline
            watch.deadline, watch.why = deadline, why
            try:
                chunk = await stream.receive_some(max_bytes)
            finally:
                watch.deadline = math.inf
            if watch.scope.cancel_called:  # reaped as the bytes came: close before any handling
                log.warning("Kafka connection from %s: %s; closing", peer, why)
                raise _CloseConnection
            return chunk
        with trio.move_on_at(deadline):
            return await stream.receive_some(max_bytes)
        log.warning("Kafka connection from %s: %s; closing", peer, why)
        raise _CloseConnection

    async def _read_frame(
        self,
        stream: trio.SocketStream,
        buf: bytearray,
        peer: str,
        login_by: float | None = None,
        watch: _ReadWatch | None = None,
    ) -> bytes | None:
        """The next request frame; ``login_by``: the connection has not authenticated yet, so it
        must by then, and its frames may announce at most ``max_preauth_bytes``."""
        now = trio.current_time()
        deadline = now + (self.read_timeout_s if buf else self.idle_timeout_s)
        max_bytes = self.max_request_bytes
        if login_by is not None:
            deadline = min(deadline, login_by)
            max_bytes = min(max_bytes, self.max_preauth_bytes)
        while len(buf) < 4:
            chunk = await self._receive(
                stream,
                65536,
                deadline,
                peer,
                "request incomplete too long"
                if buf
                else "not authenticated in time"
                if login_by is not None
                else "idle too long",
                watch,
            )
            deadline = min(deadline, trio.current_time() + self.read_timeout_s)
            if not chunk:
                if buf:
                    log.warning("Kafka connection from %s: truncated frame header; closing", peer)
                return None
            buf += chunk
        (size,) = struct.unpack_from(">i", buf)
        if size < 8 or size > max_bytes:
            log.warning(
                "Kafka connection from %s: invalid frame size %d%s; closing",
                peer,
                size,
                " before authentication (sasl.server.max.receive.size)"
                if max_bytes < self.max_request_bytes and size > max_bytes
                else "",
            )
            raise _CloseConnection
        while len(buf) < 4 + size:
            chunk = await self._receive(
                stream,
                max(65536, 4 + size - len(buf)),
                deadline,
                peer,
                "request incomplete too long",
                watch,
            )
            if not chunk:
                log.warning(
                    "Kafka connection from %s: truncated frame (%d of %d bytes); closing",
                    peer,
                    len(buf) - 4,
                    size,
                )
                return None
            buf += chunk
        frame = bytes(buf[4 : 4 + size])
        del buf[: 4 + size]
        return frame

    async def _handle(
        self, frame: bytes, peer: str, session: SaslSession | None = None, stream: Any = None
    ) -> bytes | Deferred | None:
        try:
            header, reader = read_header(frame)
        except DecodeError as e:
            log.warning("Kafka connection from %s: bad request header (%s); closing", peer, e)
            raise _CloseConnection from None
        if session is not None:
            if not session.allows(header.api_key):
                log.warning(
                    "Kafka connection from %s (client %r): API %d before SASL "
                    "authentication; closing",
                    peer,
                    header.client_id,
                    header.api_key,
                )
                raise _CloseConnection
            if header.api_key in SASL_APIS:
                lo, hi = SASL_APIS[header.api_key]
                if not lo <= header.api_version <= hi:
                    raise _CloseConnection
                try:
                    return session.handle(header, reader)
                except DecodeError as e:
                    raise SaslClose(None, f"undecodable SASL request ({e})") from None
        if self.replication_only is not None:
            refusal = self._replication_refusal(header, reader, session, stream)
            if refusal:
                log.warning(
                    "Kafka connection from %s (client %r) to replication-only listener %s:%d: "
                    "%s; closing",
                    peer,
                    header.client_id,
                    self.host,
                    self.port,
                    refusal,
                )
                raise _CloseConnection
        handler = self._handlers.get(header.api_key)
        lo, hi = self._ranges.get(header.api_key, (0, -1))
        if header.api_key == API_API_VERSIONS and not lo <= header.api_version <= hi:
            return self._api_versions_unsupported(header)
        if (
            self._admin is not None
            and header.api_key in self._admin_keys
            and lo <= header.api_version <= hi
        ):
            # in the response writer: one at a time, in order; as the connection's principal
            admin, who = self._admin, _principal(session, stream)
            return Deferred(lambda: admin.handle(header, reader, who))
        if handler is None or not lo <= header.api_version <= hi:
            log.warning(
                "Kafka connection from %s (client %r): unsupported API %d v%d; closing",
                peer,
                header.client_id,
                header.api_key,
                header.api_version,
            )
            raise _CloseConnection
        try:
            return await handler(header, reader)
        except DecodeError as e:
            log.warning(
                "Kafka connection from %s: undecodable API %d v%d request (%s); closing",
                peer,
                header.api_key,
                header.api_version,
                e,
            )
            raise _CloseConnection from None
        except Exception:  # a bug answering one request must not take the broker down
            log.exception(
                "Kafka connection from %s: API %d v%d request failed; closing",
                peer,
                header.api_key,
                header.api_version,
            )
            raise _CloseConnection from None

    def _replication_refusal(
        self, header: RequestHeader, reader: Reader, session: SaslSession | None, stream: Any
    ) -> str:
        """Why a replication-only listener refuses this request ('' = serve it): only
        ApiVersions, OffsetForLeaderEpoch and a follower's Fetch (replica id >= 0), and, when
        the listener authenticates, only from the allowed (broker) principals."""
        if header.api_key == API_API_VERSIONS:
            return ""
        if header.api_key not in REPLICATION_APIS:
            return f"API {header.api_key} is not a replication API"
        if header.api_key == API_FETCH:
            try:
                replica_id = Reader(reader.data, reader.pos).int32()
            except DecodeError:
                return "an undecodable Fetch"
            if replica_id < 0:
                return "a consumer Fetch (replica id < 0)"
        who = _principal(session, stream)
        allowed = self.replication_only or frozenset()
        if (session is not None or who != "User:ANONYMOUS") and who not in allowed:
            return f"{who} is not among replication.principals {sorted(allowed)}"
        return ""

    # ---- APIs -----------------------------------------------------------------------------
    def _api_keys(self) -> list[dict[str, int]]:
        return [
            {"api_key": k, "min_version": lo, "max_version": hi}
            for k, (lo, hi) in sorted(self._ranges.items())
            if self.replication_only is None
            or k in REPLICATION_APIS
            or k in SASL_APIS
            or k == API_API_VERSIONS
        ]

    async def _api_versions(self, header: RequestHeader, reader: Reader) -> bytes:
        # The body (client software name/version) is informational: not decoded.
        cls = response_class(API_API_VERSIONS, header.api_version)
        body = encode_body(
            build(
                cls,
                {
                    "error_code": ErrorCode.none,
                    "api_keys": self._api_keys(),
                    "throttle_time": timedelta(0),
                },
            )
        )
        return frame_response(cls, header.correlation_id, body)

    def _api_versions_unsupported(self, header: RequestHeader) -> bytes:
        cls = response_class(API_API_VERSIONS, 0)
        body = encode_body(
            build(cls, {"error_code": ErrorCode.unsupported_version, "api_keys": self._api_keys()})
        )
        return frame_response(cls, header.correlation_id, body)

    async def _metadata(self, header: RequestHeader, reader: Reader) -> bytes:
        req = read_metadata_request(header.api_version, reader)
        if self.auto_create is not None and req.allow_auto_topic_creation and req.topics:
            image = self.cache.image
            missing = [
                n
                for n, _ in req.topics
                if n and image is not None and n not in image.topics_by_name
            ]
            if missing:
                await self.auto_create(header, missing)
        body = self.cache.encoded_metadata(header.api_version, req)
        return frame_response(
            response_class(API_METADATA, header.api_version), header.correlation_id, body
        )


def _deferring(handle: Callable[[RequestHeader, Reader], Awaitable[bytes]]) -> Handler:
    """Run ``handle`` in the response writer, so it sees requests one at a time, in order."""

    async def handler(header: RequestHeader, reader: Reader) -> Deferred:
        return Deferred(lambda: handle(header, reader))

    return handler


def _principal(session: SaslSession | None, stream: Any) -> str:
    """The connection's authenticated principal: SASL's, else a verified client
    certificate's (mutual TLS), else ``User:ANONYMOUS``."""
    if session is not None and session.principal:
        return session.principal
    getpeercert = getattr(stream, "getpeercert", None)
    if getpeercert is not None:
        try:
            found = tls_principal(getpeercert())
        except Exception:  # no TLS handshake done (trio.NeedHandshakeError), no certificate
            found = None
        if found:
            return found
    return "User:ANONYMOUS"


def _peer(stream: Any) -> str:
    stream = getattr(stream, "transport_stream", stream)  # under TLS: the TCP stream
    try:
        host, port = stream.socket.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"
