"""ConsumerGroupHeartbeat (API 68) and ConsumerGroupDescribe (API 69) on the broker listener:
the request's values to the shard of the group's ``__consumer_offsets`` partition (through the
coordinator runtime, so a heartbeat's records are acknowledged only once replicated), and the
shard's answer to the response entity of the request's version. Topic ids and partition counts
come from this listener's metadata image (the assignors see what clients can fetch)."""

from __future__ import annotations

import sys
import typing
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode as E

from broker.coordinator.group.consumer_group import HeartbeatRequest, TopicView
from broker.coordinator.group.consumer_group import error as heartbeat_error
from broker.coordinator.runtime import CoordinatorError, CoordinatorRuntime
from broker.metadata.metadata_cache import MetadataCache
from broker.protocol.kafka_admin import build_entity
from broker.protocol.kafka_codec import RequestHeader, response_class

API_CONSUMER_GROUP_HEARTBEAT, API_CONSUMER_GROUP_DESCRIBE = 68, 69
CONSUMER_RANGES: dict[int, tuple[int, int]] = {
    API_CONSUMER_GROUP_HEARTBEAT: (0, 1),
    API_CONSUMER_GROUP_DESCRIBE: (0, 1),
}
_ZERO = timedelta(0)


def _assignment_entity(version: int, parts: Any) -> Any:
    """The response's nullable ``Assignment`` struct (kio: a single nested entity)."""
    if parts is None:
        return None
    cls = response_class(API_CONSUMER_GROUP_HEARTBEAT, version)
    module = vars(sys.modules[cls.__module__])
    hints = typing.get_type_hints(cls, module)
    assignment_cls = next(a for a in typing.get_args(hints["assignment"]) if a is not type(None))
    return build_entity(
        assignment_cls,
        {"topic_partitions": [{"topic_id": t, "partitions": list(ps)} for t, ps in parts]},
    )


def _describe_entity(version: int, group: dict[str, Any]) -> Any:
    """A ``DescribedGroup`` entity (its members' single nested assignments built here)."""
    cls = response_class(API_CONSUMER_GROUP_DESCRIBE, version)
    module = vars(sys.modules[cls.__module__])
    member_cls, assignment_cls = module["Member"], module["Assignment"]
    members = []
    for m in group.get("members", []):
        members.append(
            build_entity(
                member_cls,
                dict(
                    m,
                    assignment=build_entity(assignment_cls, m["assignment"]),
                    target_assignment=build_entity(assignment_cls, m["target_assignment"]),
                ),
            )
        )
    return build_entity(module["DescribedGroup"], dict(group, members=members))


class ConsumerProtocolApis:
    """The two KIP-848 APIs; ``partition(group_id)`` raises CoordinatorError without
    ``__consumer_offsets``."""

    def __init__(
        self,
        cache: MetadataCache,
        runtime: CoordinatorRuntime,
        partition: Callable[[str], int],
    ) -> None:
        self.cache = cache
        self.runtime = runtime
        self.partition = partition
        self._view: tuple[Any, TopicView, dict[uuid.UUID, str]] | None = None

    def handlers(self) -> dict[int, Callable[[RequestHeader, Any], Awaitable[dict[str, Any]]]]:
        return {
            API_CONSUMER_GROUP_HEARTBEAT: self.heartbeat,
            API_CONSUMER_GROUP_DESCRIBE: self.describe,
        }

    def topics(self) -> tuple[TopicView, dict[uuid.UUID, str]]:
        """name -> (topic id, partitions) and id -> name of the current image (cached per
        image)."""
        image = self.cache.image
        if self._view is None or self._view[0] is not image:
            view: dict[str, tuple[uuid.UUID, int]] = {}
            if image is not None:
                for name, tid in image.topics_by_name.items():
                    view[name] = (uuid.UUID(str(tid)), len(image.topics_by_id[tid].partitions))
            self._view = (image, view, {tid: name for name, (tid, _) in view.items()})
        return self._view[1], self._view[2]

    async def heartbeat(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        timeout = req.rebalance_timeout
        hr = HeartbeatRequest(
            group_id=req.group_id,
            member_id=req.member_id,
            member_epoch=req.member_epoch,
            instance_id=req.instance_id,
            rack_id=req.rack_id,
            rebalance_timeout_ms=int(timeout.total_seconds() * 1000)
            if isinstance(timeout, timedelta)
            else int(timeout),
            topics=tuple(req.subscribed_topic_names)
            if req.subscribed_topic_names is not None
            else None,
            regex=getattr(req, "subscribed_topic_regex", None),
            server_assignor=req.server_assignor,
            owned=tuple((t.topic_id, tuple(t.partitions)) for t in req.topic_partitions)
            if req.topic_partitions is not None
            else None,
            client_id=header.client_id or "",
            version=header.api_version,
        )
        topics, _ = self.topics()
        try:
            resp = await self.runtime.write(
                self.partition(req.group_id),
                lambda s, t, now: s.consumer_heartbeat(hr, topics, t, now),
            )
        except CoordinatorError as e:
            resp = heartbeat_error(e.code)
        return dict(
            resp,
            throttle_time=_ZERO,
            assignment=_assignment_entity(header.api_version, resp["assignment"]),
        )

    async def describe(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        _, names = self.topics()
        groups = []
        for gid in req.group_ids:
            try:
                found = self.runtime.shard(self.partition(gid)).consumer_describe(gid, names)
            except CoordinatorError as e:
                found = {"error_code": e.code, "error_message": None}
            base = {
                "error_code": E.none,
                "error_message": None,
                "group_id": gid,
                "group_state": "",
                "group_epoch": -1,
                "assignment_epoch": -1,
                "assignor_name": "",
                "members": [],
                "authorized_operations": -2147483648,
            }
            groups.append(_describe_entity(header.api_version, base | found))
        return {"throttle_time": _ZERO, "groups": groups}
