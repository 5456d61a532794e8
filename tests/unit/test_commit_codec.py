"""The hand-written OffsetCommit response encoder writes the bytes kio writes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from kio.schema.errors import ErrorCode

from broker.coordinator.group.commit_codec import encode_offset_commit_response
from broker.protocol.kafka_admin import build_entity
from broker.protocol.kafka_codec import encode_body, frame_response, response_class

TOPICS = [
    ("orders", [(0, 0), (7, ErrorCode.unknown_topic_or_partition.value)]),
    ("é" * 70, [(2**31 - 1, ErrorCode.not_coordinator.value)]),  # a 2-byte compact length
    ("empty", []),
]


def _kio(
    version: int, correlation_id: int, topics: list[tuple[str, list[tuple[int, int]]]]
) -> bytes:
    cls = response_class(8, version)
    values = {
        "throttle_time": timedelta(0),
        "topics": [
            {
                "name": name,
                "partitions": [
                    {"partition_index": pid, "error_code": ErrorCode(code)} for pid, code in parts
                ],
            }
            for name, parts in topics
        ],
    }
    return frame_response(cls, correlation_id, encode_body(build_entity(cls, values)))


@pytest.mark.parametrize("version", range(2, 10))
@pytest.mark.parametrize("topics", [TOPICS, TOPICS[:1], []])
def test_same_bytes_as_kio(version: int, topics: list[tuple[str, list[tuple[int, int]]]]) -> None:
    assert encode_offset_commit_response(version, -5, topics) == _kio(version, -5, topics)
