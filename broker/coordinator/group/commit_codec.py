"""OffsetCommit responses (v2-v9) encoded by hand: the hottest group API answer, written without
building kio entities (the generic path costs several times more per commit). The bytes are
those kio writes for the same version (a unit test compares them for every version)."""

from __future__ import annotations

import struct
from collections.abc import Iterable

from broker.coordinator.group.consumer_records import uvarint

FLEXIBLE_FROM = 8  # compact arrays and strings, tagged fields, response header v1
THROTTLE_FROM = 3  # throttle_time_ms leads the body


def encode_offset_commit_response(
    version: int,
    correlation_id: int,
    topics: Iterable[tuple[str, Iterable[tuple[int, int]]]],
) -> bytes:
    """The framed response: per topic name, (partition index, error code) pairs, in order;
    throttle time 0."""
    flexible = version >= FLEXIBLE_FROM
    topics = list(topics)
    parts: list[bytes] = []
    if version >= THROTTLE_FROM:
        parts.append(b"\x00\x00\x00\x00")
    parts.append(uvarint(len(topics) + 1) if flexible else struct.pack(">i", len(topics)))
    for name, partitions in topics:
        raw = name.encode()
        rows = list(partitions)
        if flexible:
            parts.append(uvarint(len(raw) + 1) + raw + uvarint(len(rows) + 1))
            parts.extend(struct.pack(">ihb", pid, code, 0) for pid, code in rows)
            parts.append(b"\x00")  # the topic's tagged fields
        else:
            parts.append(struct.pack(">h", len(raw)) + raw + struct.pack(">i", len(rows)))
            parts.extend(struct.pack(">ih", pid, code) for pid, code in rows)
    body = b"".join(parts)
    if flexible:
        return struct.pack(">iib", len(body) + 6, correlation_id, 0) + body + b"\x00"
    return struct.pack(">ii", len(body) + 4, correlation_id) + body
