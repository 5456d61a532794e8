"""DeleteRecords (API 21, v0–2): move a partition's log start offset up, on its leader.

Per partition: unknown → ``UNKNOWN_TOPIC_OR_PARTITION``; not led here →
``NOT_LEADER_OR_FOLLOWER``; offset -1 means the high watermark; an offset below 0 or above the
high watermark → ``OFFSET_OUT_OF_RANGE``. Otherwise the leader checkpoints the new log start
offset and deletes the segments wholly below it; the answer's ``low_watermark`` is the new log
start. Followers adopt it from the leader's Fetch responses (Kafka also waits for them before
answering; this answers once the leader has moved).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode

from broker.protocol.admin_decode import decode_request
from broker.protocol.kafka_codec import (
    Reader,
    RequestHeader,
    build,
    encode_body,
    frame_response,
    response_class,
)
from broker.replica.replica_manager import ReplicaManager

log = logging.getLogger(__name__)
API_DELETE_RECORDS = 21
DELETE_RECORDS_VERSIONS = (0, 2)


class DeleteRecordsHandler:
    """Answers DeleteRecords from a :class:`ReplicaManager`."""

    def __init__(self, replicas: ReplicaManager) -> None:
        self.replicas = replicas

    def _delete(self, topic: str, pid: int, offset: int) -> tuple[ErrorCode, int]:
        part = self.replicas.get_by_name(topic, pid)
        if part is None:
            known = self.replicas.has_partition(topic, pid)
            return (
                ErrorCode.not_leader_or_follower if known else ErrorCode.unknown_topic_or_partition
            ), -1
        if not part.is_leader:
            return ErrorCode.not_leader_or_follower, -1
        hw = part.high_watermark
        target = hw if offset == -1 else offset
        if target < 0 or target > hw:
            return ErrorCode.offset_out_of_range, -1
        before = part.log.log_start_offset
        low = part.log.delete_records_before(target)
        if low != before:
            log.info("DeleteRecords: %s-%d log start %d -> %d", topic, pid, before, low)
        part.wake()
        return ErrorCode.none, low

    async def delete_records(self, header: RequestHeader, reader: Reader) -> bytes:
        req = decode_request(header, reader)
        topics: list[dict[str, Any]] = []
        for t in req.topics:
            parts = []
            for p in t.partitions:
                code, low = self._delete(t.name, int(p.partition_index), int(p.offset))
                parts.append(
                    {"partition_index": p.partition_index, "low_watermark": low, "error_code": code}
                )
            topics.append({"name": t.name, "partitions": parts})
        cls = response_class(API_DELETE_RECORDS, header.api_version)
        body = encode_body(build(cls, {"throttle_time": timedelta(0), "topics": topics}))
        return frame_response(cls, header.correlation_id, body)
