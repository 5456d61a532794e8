"""Produce (v3–9): validate and append client record batches on the partition leader.

Per partition, in order: unknown topic/partition → ``UNKNOWN_TOPIC_OR_PARTITION``; not the
leader here → ``NOT_LEADER_OR_FOLLOWER``; its log dir offline here (or failing this write) →
``KAFKA_STORAGE_ERROR``; ``acks`` not 0/1/-1 → ``INVALID_REQUIRED_ACKS``;
``acks=-1`` with fewer in-sync replicas than ``min.insync.replicas`` → ``NOT_ENOUGH_REPLICAS``;
bytes that are not whole magic-2 batches with good CRC32C → ``CORRUPT_MESSAGE``; a batch
larger than the topic's ``max.message.bytes`` (else the broker's ``message.max.bytes``) →
``MESSAGE_TOO_LARGE``; an idempotent batch the partition's producer state refuses →
``OUT_OF_ORDER_SEQUENCE_NUMBER`` / ``INVALID_PRODUCER_EPOCH`` (:mod:`broker.replica.producer_state`).
Nothing of a refused partition is appended. A retried idempotent batch already in the log is
answered with its original base offset and not appended again. Batches are stored as sent
(compressed ones too); only the base offset and partition leader epoch, both outside the CRC,
are rewritten.

``acks=0`` gets no response, ``acks=1`` is answered once appended, ``acks=-1`` waits in the
*produce purgatory* until the high watermark passes every appended batch, the partition
changes leader (``NOT_LEADER_OR_FOLLOWER``), or ``timeout_ms`` passes (``REQUEST_TIMED_OUT``).
If the ISR fell below ``min.insync.replicas`` meanwhile: ``NOT_ENOUGH_REPLICAS_AFTER_APPEND``.
"""

from __future__ import annotations

import logging

import trio
from kio.schema.errors import ErrorCode

from broker.coordinator.placement import INTERNAL_TOPICS
from broker.protocol.data_codec import (
    FLEXIBLE_FROM,
    PartitionProduceResult,
    frame_raw_response,
    read_produce,
    write_produce_response,
)
from broker.protocol.kafka_codec import API_PRODUCE, Deferred, Reader, RequestHeader
from broker.replica.log_dirs import KafkaStorageError
from broker.replica.partition import Partition
from broker.replica.partition_log import InvalidBatchError, RecordTooLargeError
from broker.replica.producer_state import ProducerStateError
from broker.replica.replica_manager import ReplicaManager
from kraft.records import RESOURCE_BROKER, RESOURCE_TOPIC

log = logging.getLogger(__name__)
MESSAGE_MAX_BYTES = 1_048_588  # Kafka's message.max.bytes default


def _failed(pid: int, code: ErrorCode, message: str | None = None) -> PartitionProduceResult:
    return PartitionProduceResult(pid, code.value, error_message=message)


class ProduceHandler:
    """Appends produce requests through a :class:`ReplicaManager`."""

    def __init__(
        self, replicas: ReplicaManager, message_max_bytes: int = MESSAGE_MAX_BYTES
    ) -> None:
        self.replicas = replicas
        self.message_max_bytes = message_max_bytes

    def max_batch_bytes(self, topic: str) -> int:
        """The topic's ``max.message.bytes``, else the cluster's dynamic ``message.max.bytes``,
        else this broker's."""
        image = self.replicas.image
        if image is not None:
            for value in (
                image.config(RESOURCE_TOPIC, topic).get("max.message.bytes"),
                image.config(RESOURCE_BROKER, "").get("message.max.bytes"),
            ):
                if value is not None:
                    return int(value)
        return self.message_max_bytes

    async def produce(self, header: RequestHeader, reader: Reader) -> bytes | Deferred | None:
        req = read_produce(header.api_version, reader)
        results: list[tuple[str, list[PartitionProduceResult]]] = []
        waiting: list[
            tuple[PartitionProduceResult, Partition, int, int]
        ] = []  # result, part, epoch, end
        for name, parts in req.topics:
            out = []
            for pid, records in parts:
                res, part, end = self._append(name, pid, records, req.acks)
                out.append(res)
                if part is not None and req.acks == -1:
                    waiting.append((res, part, part.leader_epoch, end))
            results.append((name, out))
        if req.acks == 0:
            return None
        if not waiting:
            return self._respond(header, results)
        deadline = trio.current_time() + max(0, req.timeout_ms) / 1000

        async def complete() -> bytes:
            await self._await_replication(waiting, deadline)
            return self._respond(header, results)

        return Deferred(complete)

    def _append(
        self, topic: str, pid: int, records: bytes | None, acks: int
    ) -> tuple[PartitionProduceResult, Partition | None, int]:
        """Validate and append one partition's batches: (result, the partition if appended,
        the high watermark that acknowledges them)."""
        if topic in INTERNAL_TOPICS:  # written by coordinators only, as in Kafka
            return PartitionProduceResult(pid, ErrorCode.invalid_topic_exception.value), None, -1
        part = self.replicas.get_by_name(topic, pid)
        if part is None:
            code = (
                ErrorCode.kafka_storage_error
                if self.replicas.is_offline(topic, pid)
                else ErrorCode.not_leader_or_follower
                if self.replicas.has_partition(topic, pid)
                else ErrorCode.unknown_topic_or_partition
            )
            return PartitionProduceResult(pid, code.value), None, -1
        if not part.is_leader:
            return PartitionProduceResult(pid, ErrorCode.not_leader_or_follower.value), None, -1
        if acks not in (0, 1, -1):
            return PartitionProduceResult(pid, ErrorCode.invalid_required_acks.value), None, -1
        min_isr = self.replicas.min_insync_replicas(topic)
        if acks == -1 and len(part.isr) < min_isr:
            return (
                PartitionProduceResult(
                    pid,
                    ErrorCode.not_enough_replicas.value,
                    error_message=f"ISR {list(part.isr)} is smaller than min.insync.replicas={min_isr}",
                ),
                None,
                -1,
            )
        if not records:
            return (
                PartitionProduceResult(
                    pid, ErrorCode.corrupt_message.value, error_message="no records"
                ),
                None,
                -1,
            )
        try:
            result = part.append_as_leader(records, self.max_batch_bytes(topic))
        except InvalidBatchError as e:
            log.warning("produce to %s-%d rejected: %s", topic, pid, e)
            return _failed(pid, ErrorCode.corrupt_message, str(e)), None, -1
        except RecordTooLargeError as e:
            return _failed(pid, ErrorCode.message_too_large, str(e)), None, -1
        except ProducerStateError as e:
            log.info("produce to %s-%d refused: %s", topic, pid, e)
            return _failed(pid, ErrorCode[e.error], str(e)), None, -1
        except KafkaStorageError as e:
            return _failed(pid, ErrorCode.kafka_storage_error, str(e)), None, -1
        return (
            PartitionProduceResult(pid, 0, result.first_offset, part.log.log_start_offset),
            part,
            result.last_offset + 1,
        )

    async def _await_replication(
        self, waiting: list[tuple[PartitionProduceResult, Partition, int, int]], deadline: float
    ) -> None:
        pending = list(waiting)
        while True:
            still = []
            for item in pending:
                res, part, epoch, needed = item
                if part.role == "offline":
                    res.error_code = ErrorCode.kafka_storage_error.value
                elif part.role != "leader" or part.leader_epoch != epoch:
                    res.error_code = ErrorCode.not_leader_or_follower.value
                elif part.high_watermark >= needed:
                    if len(part.isr) < self.replicas.min_insync_replicas(part.topic):
                        res.error_code = ErrorCode.not_enough_replicas_after_append.value
                else:
                    still.append(item)
            pending = still
            if not pending:
                return
            if trio.current_time() >= deadline:
                for res, *_ in pending:
                    res.error_code = ErrorCode.request_timed_out.value
                return
            event = trio.Event()
            for _, part, _, _ in pending:
                part.waiters.add(event)
            with trio.move_on_at(deadline):
                await event.wait()
            for _, part, _, _ in pending:
                part.waiters.discard(event)

    @staticmethod
    def _respond(
        header: RequestHeader, results: list[tuple[str, list[PartitionProduceResult]]]
    ) -> bytes:
        for _, parts in results:
            for p in parts:
                if p.error_code != 0:
                    p.base_offset = p.log_start_offset = -1
        body = write_produce_response(header.api_version, results)
        return frame_raw_response(
            header.correlation_id, body, header.api_version >= FLEXIBLE_FROM[API_PRODUCE]
        )
