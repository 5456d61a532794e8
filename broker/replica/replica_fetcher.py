"""Follower replication: one fetcher task per source (leader) broker, speaking the Kafka API.

:class:`ReplicaFetcherManager` is a metadata publisher: after each publish it hands every local
follower partition to the fetcher of its leader (starting fetchers as needed, stopping idle
ones). A partition that is new to its fetcher, or whose leader epoch changed, is first
**truncated**: the fetcher sends OffsetForLeaderEpoch for the follower's latest epoch and cuts
the log at min(leader's end offset for that epoch, our own end offset for the epoch the leader
answered) — Kafka's KIP-101/279 rule, so a follower never keeps records the leader does not have
and never drops committed ones. Then it **fetches** (Fetch v11, ``replica_id`` = our broker id,
from our log end), appends what comes back with the leader's offsets and epochs, and takes the
leader's high watermark. Fetches use an incremental fetch session (KIP-227,
:mod:`broker.replica.fetch_session_builder`): after a full fetch, only the partitions whose fetch
offset moved are sent, and the leader answers only those with news. Epoch errors back off until
the metadata brings the new epoch; connection errors reconnect with a short backoff.

A partition added to a fetcher while its fetch waits on the leader (up to
``replica.fetch.wait.max.ms``) does not wait for that fetch: the fetch is abandoned with its
connection and the next one, on a new connection, includes the partition, so a new leader's high
watermark (and what waits on it: acks=all produces, group and offset commits) moves within
milliseconds of a failover. The fetch after an abandoned one is never abandoned itself, so a
stream of metadata changes (a big transition publishes many) cannot keep a fetcher from
completing fetches.

The connection speaks the security protocol of the leader's inter-broker listener (TLS,
SASL/PLAIN as the broker's own user: :mod:`broker.protocol.kafka_client_security`).
"""

from __future__ import annotations

import logging
import math
import struct
import time
from dataclasses import dataclass
from typing import Any

import trio
from kio.schema.errors import ErrorCode

from broker.protocol.data_codec import (
    API_OFFSET_FOR_LEADER_EPOCH,
    FOLLOWER_EPOCH_VERSION,
    FOLLOWER_FETCH_VERSION,
    EpochRequest,
    FetchPartition,
    FetchRequest,
    frame_request,
    read_fetch_session_response,
    read_offset_for_leader_epoch_response,
    write_fetch_request,
    write_offset_for_leader_epoch_request,
)
from broker.protocol.kafka_client_security import ClientSecurity, sasl_login
from broker.protocol.kafka_codec import API_FETCH, DecodeError, Reader
from broker.replica.fetch_session_builder import FetchSessionBuilder
from broker.replica.log_dirs import KafkaStorageError
from broker.replica.partition import Partition
from broker.replica.partition_log import InvalidBatchError, PartitionLog

log = logging.getLogger("broker.fetcher")
_ERRORS = (
    OSError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    ConnectionError,
    DecodeError,
    trio.TooSlowError,
)


def truncation_offset(plog: PartitionLog, leader_epoch: int, leader_end: int) -> int:
    """Where a follower cuts its log, given the leader's OffsetForLeaderEpoch answer
    (``leader_epoch``, ``leader_end``) for the follower's latest epoch: unknown → the high
    watermark; the same epoch → the leader's end for it; an older epoch → the smaller of the
    leader's and our own end offsets for that epoch. Never beyond our log end."""
    if leader_epoch < 0 or leader_end < 0:
        return min(plog.high_watermark, plog.log_end_offset)
    if leader_epoch == plog.latest_epoch:
        return min(leader_end, plog.log_end_offset)
    _, own_end = plog.end_offset_for_epoch(leader_epoch)
    return min(leader_end, own_end if own_end >= 0 else plog.high_watermark, plog.log_end_offset)


class KafkaConnection:
    """A request/response client connection to a broker's Kafka listener (non-flexible APIs)."""

    def __init__(self, stream: trio.abc.Stream, client_id: str) -> None:
        self.stream = stream
        self.client_id = client_id
        self._buf = bytearray()
        self._correlation = 0
        # an entered scope around every use of the connection (see SourceFetcher.run): a
        # request then moves its deadline instead of entering a cancel scope of its own
        self.scope: trio.CancelScope | None = None

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        client_id: str,
        timeout: float,
        security: ClientSecurity | None = None,
    ) -> KafkaConnection:
        """Connect, then (per the listener's protocol) TLS handshake and SASL/PLAIN login."""
        security = security or ClientSecurity()
        with trio.fail_after(timeout):
            stream = await trio.open_tcp_stream(host, port)
            try:
                conn = cls(await security.wrap(stream, host), client_id)
                if security.credentials is not None:
                    await sasl_login(conn, security.credentials, timeout)
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
            return conn

    async def request(self, api_key: int, version: int, body: bytes, timeout: float) -> Reader:
        """Send one request; a reader positioned at the response body. Past ``timeout``:
        ``trio.TooSlowError``, or with :attr:`scope` set, that scope is cancelled (its owner
        drops the connection)."""
        self._correlation += 1
        frame = frame_request(api_key, version, self._correlation, self.client_id, body)
        if self.scope is not None:
            self.scope.deadline = trio.current_time() + timeout
            try:
                size = await self._exchange(frame)
            finally:
                self.scope.deadline = math.inf
        else:
            with trio.fail_after(timeout):
                size = await self._exchange(frame)
        frame = bytes(self._buf[4 : 4 + size])
        del self._buf[: 4 + size]
        r = Reader(frame)
        if r.int32() != self._correlation:
            raise DecodeError("response correlation id does not match")
        return r

    async def _exchange(self, frame: bytes) -> int:
        """Send ``frame``, read the whole response into the buffer; its size."""
        await self.stream.send_all(frame)
        await self._fill(4)
        (size,) = struct.unpack_from(">i", self._buf)
        await self._fill(4 + size)
        return int(size)

    async def _fill(self, n: int) -> None:
        while len(self._buf) < n:
            chunk = await self.stream.receive_some(max(65536, n - len(self._buf)))
            if not chunk:
                raise ConnectionError("connection closed by the leader")
            self._buf += chunk

    async def aclose(self) -> None:
        await self.stream.aclose()


@dataclass(slots=True)
class _FetchState:
    leader_epoch: int
    truncate: bool = True
    retry_at: float = 0.0


RECONNECT_S = 0.2  # between attempts to reach an unreachable leader
OUTAGE_REPORT_S = 30.0  # while it stays unreachable, one line this often


class _Interrupted(Exception):
    """A fetch in flight was abandoned (the partition set grew): reconnect and fetch at once."""


class _Outage:
    """The log lines of a leader that cannot be reached: one WARNING when the outage starts,
    one line every ``OUTAGE_REPORT_S`` while it lasts, one INFO when it ends (not one line per
    attempt: attempts come every ``RECONNECT_S``)."""

    def __init__(self, leader_id: int) -> None:
        self.leader_id = leader_id
        self.since: float | None = None
        self.attempts = 0
        self.reported = 0.0

    def failed(self, now: float, why: str) -> None:
        self.attempts += 1
        if self.since is None:
            self.since = self.reported = now
            log.warning(
                "fetcher for leader %d: %s; retrying every %.1f s",
                self.leader_id,
                why,
                RECONNECT_S,
            )
        elif now - self.reported >= OUTAGE_REPORT_S:
            self.reported = now
            log.warning(
                "fetcher for leader %d: still failing after %.0f s and %d attempts: %s",
                self.leader_id,
                now - self.since,
                self.attempts,
                why,
            )

    def ended(self, now: float) -> None:
        if self.since is not None:
            log.info(
                "fetcher for leader %d: reached again after %.1f s and %d failed attempts",
                self.leader_id,
                now - self.since,
                self.attempts,
            )
        self.since, self.attempts = None, 0


class SourceFetcher:
    """Replicates the partitions this broker follows from one leader broker."""

    def __init__(self, manager: ReplicaFetcherManager, leader_id: int) -> None:
        self.manager = manager
        self.leader_id = leader_id
        self.states: dict[Partition, _FetchState] = {}
        self.session = FetchSessionBuilder()
        self.scope = trio.CancelScope()
        self._changed = trio.Event()
        self._fetch_scope: trio.CancelScope | None = None  # around a fetch waiting on the leader
        self._after_interrupt = False  # the next fetch follows an abandoned one: let it finish

    def assign(self, parts: list[Partition]) -> None:
        """Replace the partition set; new partitions and new leader epochs get truncated first."""
        states = {}
        added = False
        for p in parts:
            st = self.states.get(p)
            if st is None or st.leader_epoch != p.leader_epoch:
                st = _FetchState(p.leader_epoch)
                added = True
            states[p] = st
        if [(p, st.leader_epoch) for p, st in states.items()] != [
            (p, st.leader_epoch) for p, st in self.states.items()
        ]:
            self.session.reset()  # a new partition set: start over with a full fetch
        self.states = states
        self._changed.set()
        if added and self._fetch_scope is not None:
            self._fetch_scope.cancel()  # the waiting fetch lacks the new ones: fetch again now

    def _current(self, p: Partition, st: _FetchState) -> bool:
        return (
            self.states.get(p) is st
            and p.role == "follower"
            and p.leader == self.leader_id
            and p.leader_epoch == st.leader_epoch
        )

    async def run(self) -> None:
        m = self.manager
        conn: KafkaConnection | None = None
        outage = _Outage(self.leader_id)
        with self.scope:
            try:
                while True:
                    try:
                        if conn is None:
                            addr = m.address(self.leader_id)
                            if addr is None:
                                await self._idle(0.5)
                                continue
                            conn = await KafkaConnection.open(
                                *addr, f"replica-fetcher-{m.broker_id}", m.timeout, m.security
                            )
                        await self._serve(conn, outage)
                    except _Interrupted:
                        self._after_interrupt = True
                        self.session.reset()
                        if conn is not None:
                            await trio.aclose_forcefully(conn.stream)
                            conn = None
                    except _ERRORS as e:
                        outage.failed(time.monotonic(), str(e) or type(e).__name__)
                        self.session.reset()
                        if conn is not None:
                            await conn.aclose()
                            conn = None
                        await trio.sleep(RECONNECT_S)
            finally:
                if conn is not None:
                    with trio.CancelScope(shield=True):
                        await conn.aclose()

    async def _serve(self, conn: KafkaConnection, outage: _Outage) -> None:
        """Truncate and fetch over ``conn`` until a request on it times out
        (``trio.TooSlowError``) or fails."""
        with trio.CancelScope() as scope:
            conn.scope = scope
            try:
                while True:
                    worked = await self._truncate(conn) or await self._fetch(conn)
                    outage.ended(time.monotonic())
                    if not worked:
                        await self._idle(0.2)
            finally:
                conn.scope = None
        raise trio.TooSlowError("no answer from the leader in time")

    async def _idle(self, seconds: float) -> None:
        with trio.move_on_after(seconds):
            await self._changed.wait()
        self._changed = trio.Event()

    async def _truncate(self, conn: KafkaConnection) -> bool:
        """Truncate every partition that needs it; True if any request was sent."""
        now = time.monotonic()
        todo = [(p, st) for p, st in self.states.items() if st.truncate and st.retry_at <= now]
        asks: dict[str, list[tuple[int, int, int]]] = {}
        for p, st in todo:
            if p.log.latest_epoch < 0:  # nothing written in any epoch: keep only committed data
                self._truncate_log(p, p.log.high_watermark)
                st.truncate = False
            else:
                asks.setdefault(p.topic, []).append(
                    (p.partition, st.leader_epoch, p.log.latest_epoch)
                )
        if not asks:
            return False
        body = write_offset_for_leader_epoch_request(
            EpochRequest(self.manager.broker_id, list(asks.items()))
        )
        r = await conn.request(
            API_OFFSET_FOR_LEADER_EPOCH, FOLLOWER_EPOCH_VERSION, body, self.manager.timeout
        )
        by_key = {(p.topic, p.partition): (p, st) for p, st in todo}
        for name, parts in read_offset_for_leader_epoch_response(r):
            for pid, err, epoch, end in parts:
                found = by_key.get((name, pid))
                if found is None or not self._current(*found):
                    continue
                p, st = found
                if err:
                    st.retry_at = time.monotonic() + 0.2
                    log.info(
                        "%s-%d: OffsetForLeaderEpoch from leader %d: error %d; retrying",
                        name,
                        pid,
                        self.leader_id,
                        err,
                    )
                    continue
                self._truncate_one(p, epoch, end)
                st.truncate = False
        return True

    def _truncate_one(self, p: Partition, epoch: int, end: int) -> None:
        plog = p.log
        target = truncation_offset(plog, epoch, end)
        if target < plog.log_end_offset:
            log.info(
                "%s-%d: truncating from %d to %d (leader %d has epoch %d up to %d)",
                p.topic,
                p.partition,
                plog.log_end_offset,
                target,
                self.leader_id,
                epoch,
                end,
            )
            self._truncate_log(p, target)

    def _truncate_log(self, p: Partition, offset: int) -> None:
        try:
            p.log.truncate_to(offset)
        except OSError as e:
            try:
                p.storage_error("partition log truncation", e)
            except KafkaStorageError:  # its log dir went offline: the manager drops it
                self.manager.reconcile_soon()

    async def _fetch(self, conn: KafkaConnection) -> bool:
        """One Fetch for every ready partition; True if a request was sent."""
        m = self.manager
        now = time.monotonic()
        ready = [(p, st) for p, st in self.states.items() if not st.truncate and st.retry_at <= now]
        if not ready:
            return False
        wanted = {
            (p.topic, p.partition): FetchPartition(
                p.partition,
                st.leader_epoch,
                p.log.log_end_offset,
                p.log.log_start_offset,
                m.partition_max_bytes,
            )
            for p, st in ready
        }
        sreq = self.session.build(wanted)
        req = FetchRequest(
            m.broker_id,
            m.max_wait_ms,
            1,
            m.max_bytes,
            0,
            sreq.topics,
            sreq.session_id,
            sreq.epoch,
            sreq.forgotten,
        )
        try:
            with trio.CancelScope() as waiting:
                self._fetch_scope = None if self._after_interrupt else waiting
                try:
                    r = await conn.request(
                        API_FETCH,
                        FOLLOWER_FETCH_VERSION,
                        write_fetch_request(req),
                        m.timeout + m.max_wait_ms / 1000,
                    )
                finally:
                    self._fetch_scope = None
            if waiting.cancelled_caught:  # its answer would come on this connection: drop it
                raise _Interrupted
            self._after_interrupt = False
            error, session_id, results = read_fetch_session_response(FOLLOWER_FETCH_VERSION, r)
        except BaseException:
            self.session.reset()
            raise
        self.session.on_response(error, session_id)
        if error:
            log.info("fetch from leader %d: error %d; next fetch is full", self.leader_id, error)
            return True
        by_key = {(p.topic, p.partition): (p, st) for p, st in ready}
        for name, parts in results:
            for res in parts:
                found = by_key.get((name, res.partition))
                if found is None or not self._current(*found):
                    continue
                p, st = found
                self._apply(p, st, res.error_code or error, res)
        return True

    def _apply(self, p: Partition, st: _FetchState, err: int, res: Any) -> None:
        if err == 0:
            try:
                p.append_as_follower(res.records or b"", res.high_watermark, res.log_start_offset)
            except InvalidBatchError as e:
                log.warning(
                    "%s-%d: bad data from leader %d (%s); re-truncating",
                    p.topic,
                    p.partition,
                    self.leader_id,
                    e,
                )
                st.truncate = True
            except KafkaStorageError:  # its log dir went offline: the manager drops it
                self.manager.reconcile_soon()
            return
        if err == ErrorCode.offset_out_of_range.value:
            st.truncate = True
        st.retry_at = time.monotonic() + 0.2
        log.info("%s-%d: fetch from leader %d: error %d", p.topic, p.partition, self.leader_id, err)


class ReplicaFetcherManager:
    """Publisher that keeps one :class:`SourceFetcher` per leader this broker follows."""

    def __init__(
        self,
        replicas: Any,
        listener_name: str,
        *,
        max_wait_ms: int = 500,
        max_bytes: int = 16 << 20,
        partition_max_bytes: int = 4 << 20,
        timeout: float = 10.0,
        security: ClientSecurity | None = None,
    ) -> None:
        self.replicas = replicas
        self.security = security or ClientSecurity()
        self.broker_id = replicas.broker_id
        self.listener_name = listener_name
        self.max_wait_ms = max_wait_ms
        self.max_bytes = max_bytes
        self.partition_max_bytes = partition_max_bytes
        self.timeout = timeout
        self.fetchers: dict[int, SourceFetcher] = {}
        self._image: Any = None
        self._nursery: trio.Nursery | None = None

    def publish(self, delta: Any, image: Any, full: bool = False) -> None:
        """Publisher hook: re-plan fetchers after the replica manager applied ``delta``."""
        self._image = image
        self._reconcile()

    async def run(self) -> None:
        """Run the fetchers until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._reconcile()
            await trio.sleep_forever()

    def address(self, broker_id: int) -> tuple[str, int] | None:
        reg = self._image.brokers.get(broker_id) if self._image is not None else None
        if reg is None or not reg.endpoints:
            return None
        ep = next(
            (e for e in reg.endpoints if e.get("name") == self.listener_name), reg.endpoints[0]
        )
        return ep["host"], int(ep["port"])

    def reconcile_soon(self) -> None:
        """Re-plan the fetchers (a log dir went offline: its partitions are no longer ours)."""
        self._reconcile()

    def _reconcile(self) -> None:
        if self._nursery is None:
            return
        wanted: dict[int, list[Partition]] = {}
        for p in self.replicas.partitions.values():
            if p.role == "follower" and p.leader >= 0 and p.leader != self.broker_id:
                wanted.setdefault(p.leader, []).append(p)
        for leader, parts in wanted.items():
            f = self.fetchers.get(leader)
            if f is None:
                f = self.fetchers[leader] = SourceFetcher(self, leader)
                self._nursery.start_soon(f.run)
            f.assign(parts)
        for leader in [b for b in self.fetchers if b not in wanted]:
            self.fetchers.pop(leader).scope.cancel()
