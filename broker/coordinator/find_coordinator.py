"""FindCoordinator (v0-v4, batched keys from v4): the coordinator of a group (key type 0) is the
leader of its ``__consumer_offsets`` partition, that of a transactional id (key type 1) the
leader of its ``__transaction_state`` partition (both
:func:`~broker.coordinator.placement.partition_for`).

The first time a key is looked up and its topic does not exist, the broker asks the
controller to create it (CreateTopics through the broker's controller client, as the admin
APIs are forwarded): ``offsets.topic.num.partitions`` / ``transaction.state.log.num.partitions``
partitions, replication factor ``min(<offsets.topic|transaction.state.log>.replication.factor,
alive brokers)``, ``cleanup.policy=compact``; the lookup is answered
``COORDINATOR_NOT_AVAILABLE`` and the client retries. A partition without an alive leader is
``COORDINATOR_NOT_AVAILABLE`` too.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import trio
from kio.schema.errors import ErrorCode

from broker.coordinator.placement import OFFSETS_TOPIC, TXN_TOPIC, partition_for
from broker.metadata.metadata_cache import MetadataCache

log = logging.getLogger(__name__)

API_FIND_COORDINATOR = 10
FIND_COORDINATOR_VERSIONS = (0, 4)
KEY_GROUP, KEY_TRANSACTION = 0, 1

# (api name, body, timeout) -> controller answer; raises on failure
ControllerCall = Callable[[str, dict[str, Any], float], Awaitable[dict[str, Any]]]


class FindCoordinator:
    """Answers FindCoordinator from the metadata image; creates ``__consumer_offsets``."""

    def __init__(
        self,
        cache: MetadataCache,
        call: ControllerCall | None,
        num_partitions: int = 50,
        replication_factor: int = 3,
        txn_num_partitions: int = 50,
        txn_replication_factor: int = 3,
    ) -> None:
        self.cache = cache
        self.call = call
        self.num_partitions = num_partitions
        self.replication_factor = replication_factor
        # key type -> (topic, partitions, replication factor)
        self.topics = {
            KEY_GROUP: (OFFSETS_TOPIC, num_partitions, replication_factor),
            KEY_TRANSACTION: (TXN_TOPIC, txn_num_partitions, txn_replication_factor),
        }
        self._creating: set[str] = set()

    async def answer(self, version: int, req: Any) -> dict[str, Any]:
        """Response values for a decoded request of ``version``."""
        key_type = int(getattr(req, "key_type", KEY_GROUP))
        keys = list(req.coordinator_keys) if version >= 4 else [req.key]
        if key_type in self.topics and keys and self._partitions(key_type) is None:
            await self._create_topic(*self.topics[key_type])
        found = [{"key": k, **self._locate(k, key_type)} for k in keys]
        values: dict[str, Any] = {"throttle_time": timedelta(0), "coordinators": found}
        if version < 4:
            values.update({k: v for k, v in found[0].items() if k != "key"})
        return values

    def _partitions(self, key_type: int) -> dict[int, Any] | None:
        image = self.cache.image
        topic = self.topics[key_type][0]
        tid = image.topics_by_name.get(topic) if image is not None else None
        return image.topics_by_id[tid].partitions if tid is not None else None

    def _locate(self, key: str, key_type: int) -> dict[str, Any]:
        def unavailable(message: str) -> dict[str, Any]:
            return {
                "node_id": -1,
                "host": "",
                "port": -1,
                "error_code": ErrorCode.coordinator_not_available,
                "error_message": message,
            }

        if key_type not in self.topics:
            return dict(
                unavailable(f"Unknown coordinator key type {key_type}."),
                error_code=ErrorCode.invalid_request,
            )
        if not key:
            if key_type == KEY_GROUP:
                return dict(
                    unavailable("The group id is empty."), error_code=ErrorCode.invalid_group_id
                )
            return dict(
                unavailable("The transactional id is empty."),
                error_code=ErrorCode.invalid_request,
            )
        topic = self.topics[key_type][0]
        parts = self._partitions(key_type)
        if not parts:
            return unavailable(f"{topic} is being created.")
        pid = partition_for(key, len(parts))
        leader = parts[pid].leader
        broker = next((b for b in self.cache.alive_brokers() if b["node_id"] == leader), None)
        if broker is None:
            return unavailable(f"{topic}-{pid} has no alive leader.")
        return {
            "node_id": leader,
            "host": broker["host"],
            "port": broker["port"],
            "error_code": ErrorCode.none,
            "error_message": None,
        }

    async def _create_topic(self, topic: str, num_partitions: int, replication: int) -> None:
        if self.call is None or topic in self._creating:
            return
        alive = len(self.cache.alive_brokers())
        if alive == 0:
            return
        self._creating.add(topic)
        body: dict[str, Any] = {
            "topics": [
                {
                    "name": topic,
                    "num_partitions": num_partitions,
                    "replication_factor": min(replication, alive),
                    "configs": {"cleanup.policy": "compact"},
                }
            ],
            "validate_only": False,
        }
        try:
            with trio.move_on_after(10):
                resp = await self.call("CreateTopics", body, 10.0)
                item = (resp.get("topics") or [{}])[0]
                log.info(
                    "created %s (%d partitions, replication factor %d): %s",
                    topic,
                    num_partitions,
                    body["topics"][0]["replication_factor"],
                    item.get("error_code") or "ok",
                )
        except Exception as e:  # the client retries FindCoordinator; so do we, next time
            log.warning("creating %s failed: %s", topic, e)
        finally:
            self._creating.discard(topic)


async def handle_find_coordinator(finder: FindCoordinator, header: Any, reader: Any) -> bytes:
    """A framed FindCoordinator response (for a listener serving no group APIs)."""
    from broker.protocol.admin_decode import decode_request
    from broker.protocol.kafka_admin import build_entity
    from broker.protocol.kafka_codec import encode_body, frame_response, response_class

    values = await finder.answer(header.api_version, decode_request(header, reader))
    cls = response_class(API_FIND_COORDINATOR, header.api_version)
    return frame_response(cls, header.correlation_id, encode_body(build_entity(cls, values)))
