"""Wiring of the transaction coordinator on a broker: the runtime over ``__transaction_state``
and the task that writes the markers of every transaction in PrepareCommit / PrepareAbort.

For each such transaction (after EndTxn, a timeout, a fencing InitProducerId, or found when a
partition is loaded after a failover) the marker task looks up the leader of each of its
partitions, appends the marker directly when this broker leads it (:class:`MarkerWriter`) and
sends WriteTxnMarkers to the leader otherwise; failed partitions are retried until every one has
its marker (a deleted topic counts as done), then the transaction is completed
(CompleteCommit / CompleteAbort written). The coordinator epoch in the markers is the leader
epoch of the ``__transaction_state`` partition.
"""

from __future__ import annotations

import logging
import struct
from collections import Counter
from collections.abc import Callable
from typing import Any

import trio
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader

from broker.coordinator.placement import TXN_TOPIC
from broker.coordinator.runtime import CoordinatorError, CoordinatorRuntime
from broker.coordinator.txn.records import (
    PREPARE_ABORT,
    PREPARE_COMMIT,
    decode_record,
    encode_key,
    encode_value,
)
from broker.coordinator.txn.state_machine import PendingMarkers, TxnConfig, TxnShard
from broker.metadata.metadata_cache import MetadataCache
from broker.protocol.kafka_admin import build_entity
from broker.protocol.kafka_client_security import ClientSecurity
from broker.protocol.kafka_codec import encode_body, request_class, response_class
from broker.protocol.write_txn_markers import API_WRITE_TXN_MARKERS, MarkerWriter
from broker.replica.replica_fetcher import KafkaConnection
from broker.replica.replica_manager import ReplicaManager

log = logging.getLogger(__name__)
RETRY_S = 0.1
POLL_S = 0.2
REMOTE_TIMEOUT_S = 30.0
DONE = (ErrorCode.none, ErrorCode.unknown_topic_or_partition)

# Kafka's defaults for settings the broker config does not declare (yet)
TXN_DEFAULTS = {
    "transaction.max.timeout.ms": 900_000,
    "transactional.id.expiration.ms": 604_800_000,
    "transaction.state.log.num.partitions": 50,
    "transaction.state.log.replication.factor": 3,
}


def txn_setting(config: Any, key: str) -> int:
    """``key`` from the broker config, else Kafka's default."""
    values = getattr(config, "values", config)
    try:
        return int(values[key])
    except KeyError:
        return TXN_DEFAULTS[key]


LINK_TIMEOUT_S = 10.0  # connect, TLS handshake and SASL login to another broker


class _BrokerLink:
    """One connection to another broker's Kafka listener, for WriteTxnMarkers (v1, flexible)."""

    def __init__(self, stream: trio.abc.Stream, client_id: str) -> None:
        self.stream = stream
        self.client_id = client_id.encode()
        self.correlation = 0
        self.lock = trio.Lock()
        self.buf = bytearray()

    async def write_markers(self, markers: list[dict[str, Any]]) -> Any:
        cls = request_class(API_WRITE_TXN_MARKERS, 1)
        body = encode_body(build_entity(cls, {"markers": markers}))
        async with self.lock:
            self.correlation += 1
            head = struct.pack(
                ">hhih", API_WRITE_TXN_MARKERS, 1, self.correlation, len(self.client_id)
            )
            head += self.client_id + b"\x00"  # header v2: no tagged fields
            await self.stream.send_all(struct.pack(">i", len(head) + len(body)) + head + body)
            await self._fill(4)
            (size,) = struct.unpack_from(">i", self.buf)
            await self._fill(4 + size)
            frame = bytes(self.buf[4 : 4 + size])
            del self.buf[: 4 + size]
        (correlation,) = struct.unpack_from(">i", frame)
        if correlation != self.correlation:
            raise ConnectionError("WriteTxnMarkers: correlation id mismatch")
        resp: Any = entity_reader(response_class(API_WRITE_TXN_MARKERS, 1))(frame, 5)[0]
        return resp

    async def _fill(self, n: int) -> None:
        while len(self.buf) < n:
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise ConnectionError("connection closed by the partition leader")
            self.buf += chunk


class TxnCoordinator:
    """The runtime over ``__transaction_state`` and its marker task."""

    def __init__(
        self,
        config: Any,
        node_id: int,
        replicas: ReplicaManager,
        cache: MetadataCache,
        markers: MarkerWriter,
        *,
        clock: Callable[[], float] | None = None,
        security: ClientSecurity | None = None,
    ) -> None:
        cfg = TxnConfig(
            max_timeout_ms=txn_setting(config, "transaction.max.timeout.ms"),
            id_expiration_ms=txn_setting(config, "transactional.id.expiration.ms"),
        )
        kwargs: dict[str, Any] = {} if clock is None else {"clock": clock}
        self.runtime = CoordinatorRuntime(
            replicas,
            TXN_TOPIC,
            lambda: TxnShard(cfg),
            lambda rec: (encode_key(rec[0]), encode_value(rec[1])),
            decode_record,
            **kwargs,
        )
        self.node_id = node_id
        self.cache = cache
        self.markers = markers
        # how to reach other brokers: the inter-broker listener's TLS and SASL, as replication
        self.security = security or ClientSecurity()
        self._inflight: set[tuple[int, str, int, int]] = set()
        self._wake = trio.Event()
        self._links: dict[int, _BrokerLink] = {}
        self._completion = trio.Event()  # set (and replaced) whenever a transaction completes
        self.completed = 0
        # for the metrics: transactions begun here (counted by the APIs), ended here, and the
        # time from Prepare to Complete (the markers) of those ended, in ms
        self.started = 0
        self.ended = {True: 0, False: 0}  # commit -> count
        self.completion_ms = {True: 0, False: 0}  # commit -> summed ms

    def metrics(self) -> dict[str, Any]:
        """Transactional ids by state and the counters above, for the broker's metrics."""
        states: Counter[str] = Counter()
        for shard in self.runtime.loaded_shards():
            for t in shard.txns.values():
                states[t.state_name] += 1
        loading = sum(1 for s in self.runtime.slots.values() if s.loading)
        return {
            "txns_by_state": dict(states),
            "partitions": {"loading": loading, "active": len(self.runtime.slots) - loading},
            "started": self.started,
            "committed": self.ended[True],
            "aborted": self.ended[False],
            "commit_ms_sum": self.completion_ms[True],
            "abort_ms_sum": self.completion_ms[False],
        }

    def poke(self) -> None:
        """A transaction may have entered a Prepare state: look for markers to write now."""
        self._wake.set()

    async def wait_completed(self, part_id: int, tid: str, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until ``tid`` has left PrepareCommit / PrepareAbort: a
        request meeting a transaction whose markers are being written is held until then
        rather than answered CONCURRENT_TRANSACTIONS (the client would back off)."""
        with trio.move_on_after(timeout_s):
            while True:
                try:
                    t = self.runtime.shard(part_id).describe(tid)
                except CoordinatorError:
                    return
                if t is None or t.state not in (PREPARE_COMMIT, PREPARE_ABORT):
                    return
                await self._completion.wait()

    async def run_markers(self) -> None:
        """Write markers of Prepare transactions and complete them, until cancelled."""
        async with trio.open_nursery() as nursery:
            while True:
                for part_id, slot in list(self.runtime.slots.items()):
                    if slot.loading:
                        continue
                    for pm in slot.shard.pending_markers():
                        key = (part_id, pm.transactional_id, pm.producer_id, pm.producer_epoch)
                        if key not in self._inflight:
                            self._inflight.add(key)
                            nursery.start_soon(self._finish, part_id, slot, pm, key)
                self._wake = trio.Event()
                with trio.move_on_after(POLL_S):
                    await self._wake.wait()

    async def _finish(
        self, part_id: int, slot: Any, pm: PendingMarkers, key: tuple[int, str, int, int]
    ) -> None:
        epoch = int(slot.leader_epoch)
        try:
            # No marker before the Prepare record is replicated: the scan also runs on a timer
            # and on other transactions' writes, and a Prepare lost in a failover, then aborted
            # by the next coordinator, would leave some partitions committed.
            await self.runtime.replicated(part_id)
            remaining = set(pm.partitions)
            while remaining:
                if self.runtime.slots.get(part_id) is not slot:
                    return  # no longer the coordinator: the next one finishes it
                remaining = await self._send(epoch, pm, remaining)
                if remaining:
                    await trio.sleep(RETRY_S)

            took = -1  # ms from Prepare to Complete; -1: nothing to complete any more

            def complete(shard: Any, token: Any, now: int) -> Any:
                nonlocal took
                t = shard.describe(pm.transactional_id)
                result = shard.complete(
                    pm.transactional_id, pm.producer_id, pm.producer_epoch, now
                ).answer(token, {})
                if result.records and t is not None:
                    took = max(0, now - t.last_update_ms)
                # Every marker is replicated, so the outcome is decided: a waiting EndTxn may
                # answer now (if the Complete record is lost, the next coordinator redoes the
                # markers and completes it).
                self._completion.set()
                self._completion = trio.Event()
                return result

            await self.runtime.write(part_id, complete)
            self.completed += 1
            if took >= 0:
                self.ended[pm.commit] += 1
                self.completion_ms[pm.commit] += took
        except CoordinatorError as e:
            log.info("transaction %r: not completed here (%s)", pm.transactional_id, e.code.name)
        finally:
            self._inflight.discard(key)

    def _leader(self, topic: str, partition: int) -> int:
        image = self.cache.image
        tid = image.topics_by_name.get(topic) if image is not None else None
        if image is None or tid is None:
            return -2  # the topic is gone
        part = image.topics_by_id[tid].partitions.get(partition)
        return -2 if part is None else int(part.leader)

    async def _send(
        self, coordinator_epoch: int, pm: PendingMarkers, parts: set[tuple[str, int]]
    ) -> set[tuple[str, int]]:
        """Write the markers of ``pm`` to ``parts``; the partitions still to do."""
        by_leader: dict[int, list[tuple[str, int]]] = {}
        for tp in sorted(parts):
            by_leader.setdefault(self._leader(*tp), []).append(tp)
        left: set[tuple[str, int]] = set()

        async def one(leader: int, tps: list[tuple[str, int]]) -> None:
            if leader == self.node_id:
                codes = await self.markers.write(
                    pm.producer_id, pm.producer_epoch, pm.commit, coordinator_epoch, tps
                )
            else:
                codes = await self._remote(leader, coordinator_epoch, pm, tps)
            left.update(tp for tp in tps if codes.get(tp) not in DONE)

        async with trio.open_nursery() as nursery:  # every leader at once
            for leader, tps in by_leader.items():
                if leader == -2:
                    continue  # deleted topic: nothing to mark
                if leader < 0:
                    left.update(tps)
                    continue
                nursery.start_soon(one, leader, tps)
        return left

    async def _remote(
        self, broker: int, coordinator_epoch: int, pm: PendingMarkers, tps: list[tuple[str, int]]
    ) -> dict[tuple[str, int], ErrorCode]:
        by_topic: dict[str, list[int]] = {}
        for t, p in tps:
            by_topic.setdefault(t, []).append(p)
        marker = {
            "producer_id": pm.producer_id,
            "producer_epoch": pm.producer_epoch,
            "transaction_result": pm.commit,
            "coordinator_epoch": coordinator_epoch,
            "topics": [{"name": t, "partition_indexes": ps} for t, ps in by_topic.items()],
        }
        try:
            with trio.fail_after(REMOTE_TIMEOUT_S):
                link = await self._link(broker)
                resp = await link.write_markers([marker])
        except (OSError, ConnectionError, trio.TooSlowError, trio.BrokenResourceError) as e:
            log.info("WriteTxnMarkers to broker %d failed: %s", broker, e)
            old = self._links.pop(broker, None)
            if old is not None:
                await old.stream.aclose()
            return {}
        codes: dict[tuple[str, int], ErrorCode] = {}
        for m in resp.markers:
            for t in m.topics:
                for p in t.partitions:
                    codes[(t.name, int(p.partition_index))] = ErrorCode(p.error_code)
        return codes

    async def _link(self, broker: int) -> _BrokerLink:
        link = self._links.get(broker)
        if link is None:
            found = next((b for b in self.cache.alive_brokers() if b["node_id"] == broker), None)
            if found is None:
                raise ConnectionError(f"broker {broker} is not alive")
            client_id = f"txn-coordinator-{self.node_id}"
            conn = await KafkaConnection.open(
                found["host"], found["port"], client_id, LINK_TIMEOUT_S, self.security
            )
            link = self._links[broker] = _BrokerLink(conn.stream, client_id)
        return link
