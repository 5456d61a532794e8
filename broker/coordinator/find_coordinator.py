"""FindCoordinator (v0–v4): pykraft has no group or transaction coordinator yet, so every key is
answered ``COORDINATOR_NOT_AVAILABLE`` with a message saying so (clients retry or give up as
they would during a coordinator move). The API is advertised anyway because librdkafka enables
LZ4 compression only when brokers advertise FindCoordinator.
"""

from __future__ import annotations

from datetime import timedelta

from kio.index import load_request_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader

from broker.protocol.kafka_codec import (
    DecodeError,
    Reader,
    RequestHeader,
    build,
    encode_body,
    frame_response,
    response_class,
)

API_FIND_COORDINATOR = 10
FIND_COORDINATOR_VERSIONS = (0, 4)
MESSAGE = "pykraft has no group or transaction coordinator yet (consumers: use assign mode)"


async def find_coordinator(header: RequestHeader, reader: Reader) -> bytes:
    """Answer every requested key with COORDINATOR_NOT_AVAILABLE."""
    try:
        req, _ = entity_reader(load_request_schema(API_FIND_COORDINATOR, header.api_version))(
            reader.data, reader.pos
        )
    except Exception as e:  # kio raises assorted errors on bad bodies
        raise DecodeError(f"FindCoordinator v{header.api_version}: {e}") from None
    unavailable = {
        "node_id": -1,
        "host": "",
        "port": -1,
        "error_code": ErrorCode.coordinator_not_available,
        "error_message": MESSAGE,
    }
    values = {"throttle_time": timedelta(0), **unavailable}
    if header.api_version >= 4:
        values["coordinators"] = [{"key": k, **unavailable} for k in req.coordinator_keys]
    cls = response_class(API_FIND_COORDINATOR, header.api_version)
    return frame_response(cls, header.correlation_id, encode_body(build(cls, values)))
