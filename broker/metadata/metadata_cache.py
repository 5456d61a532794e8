"""The broker's view of cluster metadata for Kafka clients, swapped whole on every publish.

Answers Metadata requests from the current :class:`kraft.metadata.image.MetadataImage` the way a KRaft
broker does: only unfenced brokers are listed (with the endpoint of this broker's listener
name), the "controller" a client sees is an alive broker (clients cannot reach KRaft
controllers; Kafka picks a random alive broker, we pick the lowest id so responses cache), a
partition whose leader is not alive gets ``LEADER_NOT_AVAILABLE``, and replicas that are not
alive are reported as offline. Encoded response bodies are cached per image.
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode

from broker.protocol.kafka_codec import (
    API_METADATA,
    MetadataRequest,
    build,
    encode_body,
    response_class,
)

log = logging.getLogger(__name__)
_CACHE_ENTRIES = 64


class MetadataCache:
    """Holds the latest image; publishers call :meth:`publish`, the listener reads."""

    def __init__(
        self, cluster_id: str, listener_name: str = "PLAINTEXT", image: Any = None
    ) -> None:
        self.cluster_id = cluster_id
        self.listener_name = listener_name
        self.image = image
        self._encoded: dict[
            tuple[int, tuple[tuple[str | None, uuid.UUID | None], ...] | None], bytes
        ] = {}

    def publish(self, delta: Any, image: Any, full: bool = False) -> None:
        """Publisher hook: adopt ``image`` (the delta is not needed here)."""
        self.set_image(image)

    def set_image(self, image: Any) -> None:
        if image is not self.image:
            self.image = image
            self._encoded.clear()

    # ---- views ----------------------------------------------------------------------------
    def alive_brokers(self) -> list[dict[str, Any]]:
        """Unfenced brokers with this listener's endpoint, by id."""
        out: list[dict[str, Any]] = []
        if self.image is None:
            return out
        for bid in sorted(self.image.brokers):
            reg = self.image.brokers[bid]
            if reg.fenced:
                continue
            ep = next((e for e in reg.endpoints if e["name"] == self.listener_name), None)
            if ep is None:
                continue
            out.append({"node_id": bid, "host": ep["host"], "port": ep["port"], "rack": reg.rack})
        return out

    def _partition(self, pid: int, reg: Any, alive: set[int]) -> dict[str, Any]:
        leader_alive = reg.leader in alive
        return {
            "error_code": ErrorCode.none if leader_alive else ErrorCode.leader_not_available,
            "partition_index": pid,
            "leader_id": reg.leader if leader_alive else -1,
            "leader_epoch": reg.leader_epoch,
            "replica_nodes": list(reg.replicas),
            "isr_nodes": list(reg.isr),
            "offline_replicas": [r for r in reg.replicas if r not in alive],
        }

    def _topic(self, topic: Any, alive: set[int]) -> dict[str, Any]:
        return {
            "error_code": ErrorCode.none,
            "name": topic.name,
            "topic_id": uuid.UUID(topic.topic_id),
            "is_internal": topic.name.startswith("__"),
            "partitions": [
                self._partition(pid, topic.partitions[pid], alive)
                for pid in sorted(topic.partitions)
            ],
        }

    def metadata_values(self, req: MetadataRequest) -> dict[str, Any]:
        """The Metadata response as a dict of values (any version)."""
        brokers = self.alive_brokers()
        alive = {b["node_id"] for b in brokers}
        image = self.image
        topics: list[dict[str, Any]] = []
        if image is not None:
            if req.topics is None:
                names = sorted(image.topics_by_name)
                topics = [
                    self._topic(image.topics_by_id[image.topics_by_name[n]], alive) for n in names
                ]
            else:
                for name, topic_id in req.topics:
                    tid = (
                        str(topic_id)
                        if topic_id is not None
                        else image.topics_by_name.get(name or "")
                    )
                    topic = image.topics_by_id.get(tid) if tid else None
                    if topic is not None:
                        topics.append(self._topic(topic, alive))
                    elif topic_id is not None:
                        topics.append(
                            {
                                "error_code": ErrorCode.unknown_topic_id,
                                "name": None,
                                "topic_id": topic_id,
                                "partitions": [],
                            }
                        )
                    else:
                        topics.append(
                            {
                                "error_code": ErrorCode.unknown_topic_or_partition,
                                "name": name,
                                "topic_id": uuid.UUID(int=0),
                                "partitions": [],
                            }
                        )
        return {
            "throttle_time": timedelta(0),
            "brokers": brokers,
            "cluster_id": self.cluster_id,
            "controller_id": min(alive) if alive else -1,
            "topics": topics,
            "error_code": ErrorCode.none,
        }

    def encoded_metadata(self, version: int, req: MetadataRequest) -> bytes:
        """The encoded Metadata response body, cached per (image, version, request)."""
        key = (version, req.topics)
        body = self._encoded.get(key)
        if body is None:
            cls = response_class(API_METADATA, version)
            body = encode_body(build(cls, self.metadata_values(req)))
            if len(self._encoded) >= _CACHE_ENTRIES:
                self._encoded.clear()
            self._encoded[key] = body
        return body
