"""InitProducerId (API 22, v0–5) for idempotent producers.

A request without a transactional id gets a fresh producer id (from
:class:`~broker.coordinator.producer_id_manager.ProducerIdManager`) and epoch 0, every time, as
Kafka does: a producer that re-initialises (after an ``OUT_OF_ORDER_SEQUENCE_NUMBER``, say) starts
a new sequence under a new id. Transactions are not served yet: a transactional id gets
``COORDINATOR_NOT_AVAILABLE``. No controller answering gets ``COORDINATOR_NOT_AVAILABLE`` too
(retriable: clients try again).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from kio.schema.errors import ErrorCode

from broker.coordinator.producer_id_manager import ProducerIdManager
from broker.protocol.admin_decode import decode_request
from broker.protocol.kafka_codec import (
    Reader,
    RequestHeader,
    build,
    encode_body,
    frame_response,
    response_class,
)
from kraft.errors import KraftError

log = logging.getLogger(__name__)
API_INIT_PRODUCER_ID = 22
INIT_PRODUCER_ID_VERSIONS = (0, 5)


class InitProducerIdHandler:
    """Answers InitProducerId from a :class:`ProducerIdManager`."""

    def __init__(self, ids: ProducerIdManager) -> None:
        self.ids = ids

    async def init_producer_id(self, header: RequestHeader, reader: Reader) -> bytes:
        req = decode_request(header, reader)
        pid, epoch, code = -1, -1, ErrorCode.none
        if req.transactional_id is not None:
            code = ErrorCode.coordinator_not_available
            log.info(
                "InitProducerId from client %r for transactional id %r: transactions are "
                "not supported",
                header.client_id,
                req.transactional_id,
            )
        else:
            try:
                pid, epoch = await self.ids.next_id(), 0
            except KraftError as e:
                log.warning(
                    "InitProducerId from client %r: no producer id: %s", header.client_id, e
                )
                code = ErrorCode.coordinator_not_available
        cls = response_class(API_INIT_PRODUCER_ID, header.api_version)
        body = encode_body(
            build(
                cls,
                {
                    "throttle_time": timedelta(0),
                    "error_code": code,
                    "producer_id": pid,
                    "producer_epoch": epoch,
                },
            )
        )
        return frame_response(cls, header.correlation_id, body)
