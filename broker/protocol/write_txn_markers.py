"""WriteTxnMarkers (API 27, v1): a transaction coordinator asks a partition leader to end a
transaction on its partitions by appending a commit or abort marker (a control batch).

Per partition: unknown → ``UNKNOWN_TOPIC_OR_PARTITION``; not the leader here →
``NOT_LEADER_OR_FOLLOWER``; a marker older than the producer's epoch →
``INVALID_PRODUCER_EPOCH``; otherwise the marker is appended and the answer waits until the high
watermark passes it (acks=all), the leader changes (``NOT_LEADER_OR_FOLLOWER``) or the timeout
passes (``REQUEST_TIMED_OUT``). On a ``__consumer_offsets`` partition the group coordinator is
also told, so the transaction's offsets (TxnOffsetCommit) become visible or are dropped.
:class:`MarkerWriter` is also the coordinator's direct path for partitions this broker leads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import trio
from kio.schema.errors import ErrorCode

from broker.coordinator.placement import OFFSETS_TOPIC
from broker.protocol.admin_decode import decode_request
from broker.protocol.kafka_admin import build_entity
from broker.protocol.kafka_codec import (
    Reader,
    RequestHeader,
    encode_body,
    frame_response,
    response_class,
)
from broker.replica.log_dirs import KafkaStorageError
from broker.replica.producer_state import ProducerStateError
from broker.replica.replica_manager import ReplicaManager

log = logging.getLogger(__name__)
API_WRITE_TXN_MARKERS = 27
WRITE_TXN_MARKERS_VERSIONS = (1, 1)
MARKER_TIMEOUT_S = 30.0

# (offsets partition, producer id, commit) -> error: the group coordinator's end of a txn
OffsetsMarker = Callable[[int, int, bool], Awaitable[ErrorCode]]


class MarkerWriter:
    """Appends transaction markers to partitions this broker leads."""

    def __init__(self, replicas: ReplicaManager, offsets_marker: OffsetsMarker | None = None):
        self.replicas = replicas
        self.offsets_marker = offsets_marker

    async def write(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        partitions: list[tuple[str, int]],
        timeout_s: float = MARKER_TIMEOUT_S,
    ) -> dict[tuple[str, int], ErrorCode]:
        """Append the marker to each partition and wait for it to be replicated."""
        codes: dict[tuple[str, int], ErrorCode] = {}
        waiting = []
        now_ms = int(time.time() * 1000)
        for topic, pid in partitions:
            part = self.replicas.get_by_name(topic, pid)
            if part is None:
                known = self.replicas.has_partition(topic, pid)
                codes[(topic, pid)] = (
                    ErrorCode.kafka_storage_error
                    if self.replicas.is_offline(topic, pid)
                    else ErrorCode.not_leader_or_follower
                    if known
                    else ErrorCode.unknown_topic_or_partition
                )
                continue
            if not part.is_leader:
                codes[(topic, pid)] = ErrorCode.not_leader_or_follower
                continue
            try:
                offset = part.append_marker(
                    producer_id, producer_epoch, commit, coordinator_epoch, now_ms
                )
            except ProducerStateError as e:
                log.info("marker for %s-%d refused: %s", topic, pid, e)
                codes[(topic, pid)] = ErrorCode[e.error]
                continue
            except KafkaStorageError:
                codes[(topic, pid)] = ErrorCode.kafka_storage_error
                continue
            waiting.append(((topic, pid), part, part.leader_epoch, offset + 1))
        with trio.move_on_after(timeout_s):
            for key, part, epoch, needed in waiting:
                while part.is_leader and part.leader_epoch == epoch:
                    if part.high_watermark >= needed:
                        break
                    event = trio.Event()
                    part.waiters.add(event)
                    await event.wait()
                if not part.is_leader or part.leader_epoch != epoch:
                    codes[key] = ErrorCode.not_leader_or_follower
                    continue
                codes[key] = ErrorCode.none
                if key[0] == OFFSETS_TOPIC and self.offsets_marker is not None:
                    codes[key] = await self.offsets_marker(key[1], producer_id, commit)
        for key, *_ in waiting:
            codes.setdefault(key, ErrorCode.request_timed_out)
        return codes


class WriteTxnMarkersHandler:
    """The listener's WriteTxnMarkers handler."""

    def __init__(self, writer: MarkerWriter) -> None:
        self.writer = writer

    async def write_txn_markers(self, header: RequestHeader, reader: Reader) -> bytes:
        req = decode_request(header, reader)
        out = []
        for m in req.markers:
            parts = [(t.name, int(p)) for t in m.topics for p in t.partition_indexes]
            codes = await self.writer.write(
                int(m.producer_id),
                int(m.producer_epoch),
                bool(m.transaction_result),
                int(m.coordinator_epoch),
                parts,
            )
            out.append(
                {
                    "producer_id": m.producer_id,
                    "topics": [
                        {
                            "name": t.name,
                            "partitions": [
                                {"partition_index": p, "error_code": codes[(t.name, int(p))]}
                                for p in t.partition_indexes
                            ],
                        }
                        for t in m.topics
                    ],
                }
            )
        cls = response_class(API_WRITE_TXN_MARKERS, header.api_version)
        return frame_response(
            cls, header.correlation_id, encode_body(build_entity(cls, {"markers": out}))
        )
