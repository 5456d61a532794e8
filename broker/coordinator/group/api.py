"""The classic group APIs on the broker listener: decode with kio, route each group to its
``__consumer_offsets`` partition, run the request on that partition's shard through the
:class:`~broker.coordinator.runtime.CoordinatorRuntime`, encode the answer for the request's
version. A group whose partition this broker does not lead gets ``NOT_COORDINATOR``; one still
loading gets ``COORDINATOR_LOAD_IN_PROGRESS``; no ``__consumer_offsets`` yet gets
``COORDINATOR_NOT_AVAILABLE`` (FindCoordinator creates it). OffsetCommit to a topic or
partition the metadata does not know gets ``UNKNOWN_TOPIC_OR_PARTITION``, as in Kafka.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode as E

from broker.coordinator.find_coordinator import FindCoordinator
from broker.coordinator.group.commit_codec import encode_offset_commit_response
from broker.coordinator.group.consumer_api import CONSUMER_RANGES, ConsumerProtocolApis
from broker.coordinator.group.state_machine import (
    CommitPartition,
    JoinRequest,
    SyncRequest,
    error_join,
    error_sync,
)
from broker.coordinator.placement import OFFSETS_TOPIC, partition_for
from broker.coordinator.runtime import CoordinatorError, CoordinatorRuntime
from broker.metadata.metadata_cache import MetadataCache
from broker.protocol.admin_decode import decode_request
from broker.protocol.kafka_admin import build_entity
from broker.protocol.kafka_codec import (
    DecodeError,
    Reader,
    RequestHeader,
    encode_body,
    frame_response,
    response_class,
)

log = logging.getLogger(__name__)

API_OFFSET_COMMIT, API_OFFSET_FETCH, API_FIND_COORDINATOR, API_JOIN_GROUP = 8, 9, 10, 11
API_HEARTBEAT, API_LEAVE_GROUP, API_SYNC_GROUP, API_DESCRIBE_GROUPS = 12, 13, 14, 15
API_LIST_GROUPS, API_DELETE_GROUPS, API_OFFSET_DELETE = 16, 42, 47

RANGES: dict[int, tuple[int, int]] = {
    API_OFFSET_COMMIT: (2, 9),
    API_OFFSET_FETCH: (1, 9),
    API_FIND_COORDINATOR: (0, 4),
    API_JOIN_GROUP: (0, 9),
    API_HEARTBEAT: (0, 4),
    API_LEAVE_GROUP: (0, 5),
    API_SYNC_GROUP: (0, 5),
    API_DESCRIBE_GROUPS: (0, 5),
    API_LIST_GROUPS: (0, 5),
    API_DELETE_GROUPS: (0, 2),
    API_OFFSET_DELETE: (0, 0),
    **CONSUMER_RANGES,  # ConsumerGroupHeartbeat, ConsumerGroupDescribe (KIP-848)
}
_ZERO = timedelta(0)


def _ms(value: Any) -> int:
    return int(value.total_seconds() * 1000) if isinstance(value, timedelta) else int(value)


class GroupApis:
    """Listener handler for FindCoordinator and the classic group and offset APIs."""

    def __init__(
        self, cache: MetadataCache, runtime: CoordinatorRuntime, finder: FindCoordinator
    ) -> None:
        self.cache = cache
        self.runtime = runtime
        self.finder = finder
        self._apis: dict[int, Callable[[RequestHeader, Any], Awaitable[dict[str, Any]]]] = {
            API_FIND_COORDINATOR: self._find_coordinator,
            API_JOIN_GROUP: self._join,
            API_SYNC_GROUP: self._sync,
            API_HEARTBEAT: self._heartbeat,
            API_LEAVE_GROUP: self._leave,
            API_OFFSET_FETCH: self._fetch,
            API_LIST_GROUPS: self._list,
            API_DESCRIBE_GROUPS: self._describe,
            API_DELETE_GROUPS: self._delete,
            API_OFFSET_DELETE: self._delete_offsets,
        }
        self._apis.update(ConsumerProtocolApis(cache, runtime, self._partition).handlers())

    def api_ranges(self) -> dict[int, tuple[int, int]]:
        return dict(RANGES)

    async def handle(self, header: RequestHeader, reader: Reader) -> bytes:
        req = decode_request(header, reader)
        try:
            if header.api_key == API_OFFSET_COMMIT:  # the hot one: encoded by hand
                return encode_offset_commit_response(
                    header.api_version, header.correlation_id, await self._commit(header, req)
                )
            values = await self._apis[header.api_key](header, req)
            cls = response_class(header.api_key, header.api_version)
            return frame_response(
                cls, header.correlation_id, encode_body(build_entity(cls, values))
            )
        except Exception as e:  # a bug here closes one connection, never the broker
            log.exception("group API %d v%d failed", header.api_key, header.api_version)
            raise DecodeError(f"internal error: {e}") from None

    # ---- routing -----------------------------------------------------------------------------
    def _partition(self, group_id: str) -> int:
        """The group's partition, or CoordinatorError when the offsets topic does not exist."""
        image = self.cache.image
        tid = image.topics_by_name.get(OFFSETS_TOPIC) if image is not None else None
        if tid is None:
            raise CoordinatorError(E.coordinator_not_available)
        return partition_for(group_id, len(image.topics_by_id[tid].partitions))

    async def _write(
        self, group_id: str, fn: Callable[[Any, Any, int], Any], timeout_s: float = 30.0
    ) -> Any:
        return await self.runtime.write(self._partition(group_id), fn, timeout_s)

    def _shard(self, group_id: str) -> Any:
        return self.runtime.shard(self._partition(group_id))

    # ---- APIs --------------------------------------------------------------------------------
    async def _find_coordinator(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        return await self.finder.answer(header.api_version, req)

    async def _join(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        session = _ms(req.session_timeout)
        rebalance = _ms(getattr(req, "rebalance_timeout", None) or req.session_timeout)
        if header.api_version == 0:
            rebalance = session
        jr = JoinRequest(
            group_id=req.group_id,
            member_id=req.member_id,
            group_instance_id=getattr(req, "group_instance_id", None),
            session_timeout_ms=session,
            rebalance_timeout_ms=rebalance,
            protocol_type=req.protocol_type,
            protocols=tuple((p.name, bytes(p.metadata)) for p in req.protocols),
            client_id=header.client_id or "",
            require_known_member_id=header.api_version >= 4,
        )
        try:
            resp = await self._write(
                req.group_id, lambda s, t, now: s.join(jr, t, now), rebalance / 1000 + 10
            )
        except CoordinatorError as e:
            resp = error_join(e.code, req.member_id)
        resp = dict(resp, throttle_time=_ZERO)
        if header.api_version < 7:
            resp["protocol_name"] = resp["protocol_name"] or ""
        return resp

    async def _sync(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        sr = SyncRequest(
            group_id=req.group_id,
            generation_id=req.generation_id,
            member_id=req.member_id,
            group_instance_id=getattr(req, "group_instance_id", None),
            protocol_type=getattr(req, "protocol_type", None),
            protocol_name=getattr(req, "protocol_name", None),
            assignments=tuple((a.member_id, bytes(a.assignment)) for a in req.assignments),
        )
        try:
            resp = await self._write(req.group_id, lambda s, t, now: s.sync(sr, t, now), 300)
        except CoordinatorError as e:
            resp = error_sync(e.code)
        return dict(resp, throttle_time=_ZERO)

    async def _heartbeat(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        try:
            code = self._shard(req.group_id).heartbeat(
                req.group_id,
                req.generation_id,
                req.member_id,
                getattr(req, "group_instance_id", None),
                self.runtime.now_ms(),
            )
        except CoordinatorError as e:
            code = e.code
        return {"throttle_time": _ZERO, "error_code": code}

    async def _leave(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        if header.api_version >= 3:
            members = [(m.member_id, m.group_instance_id) for m in req.members]
        else:
            members = [(req.member_id, None)]
        errors: list[E] = []
        top = E.none

        def fn(shard: Any, token: Any, now: int) -> Any:
            nonlocal top, errors
            result, top, errors = shard.leave(req.group_id, members, now)
            return result.answer(token, {})

        try:
            await self._write(req.group_id, fn)
        except CoordinatorError as e:
            top, errors = e.code, [e.code] * len(members)
        if header.api_version < 3 and errors and top == E.none:
            top = errors[0]
        return {
            "throttle_time": _ZERO,
            "error_code": top,
            "members": [
                {"member_id": mid, "group_instance_id": iid, "error_code": err}
                for (mid, iid), err in zip(members, errors)
            ],
        }

    async def _commit(
        self, header: RequestHeader, req: Any
    ) -> list[tuple[str, list[tuple[int, int]]]]:
        """Per topic of the request, (partition index, error code) of each partition."""
        image = self.cache.image
        known: list[CommitPartition] = []
        unknown: set[tuple[str, int]] = set()
        for t in req.topics:
            tid = image.topics_by_name.get(t.name) if image is not None else None
            parts = image.topics_by_id[tid].partitions if tid is not None else {}
            for p in t.partitions:
                if p.partition_index not in parts:
                    unknown.add((t.name, p.partition_index))
                    continue
                known.append(
                    CommitPartition(
                        t.name,
                        p.partition_index,
                        p.committed_offset,
                        getattr(p, "committed_leader_epoch", -1),
                        p.committed_metadata,
                    )
                )
        codes: dict[tuple[str, int], E] = dict.fromkeys(unknown, E.unknown_topic_or_partition)
        generation = req.generation_id_or_member_epoch

        def fn(shard: Any, token: Any, now: int) -> Any:
            result, every, per = shard.commit(
                req.group_id,
                generation,
                req.member_id,
                getattr(req, "group_instance_id", None),
                known,
                now,
            )
            for i, p in enumerate(known):
                codes[(p.topic, p.partition)] = every if every is not None else per[i]
            return result.answer(token, {})

        if known:
            try:
                await self._write(req.group_id, fn)
                self.runtime.meter("offset-commit").record(
                    sum(1 for p in known if codes.get((p.topic, p.partition)) == E.none)
                )
            except CoordinatorError as e:
                for p in known:
                    codes[(p.topic, p.partition)] = e.code
        return [
            (
                t.name,
                [
                    (p.partition_index, codes.get((t.name, p.partition_index), E.none).value)
                    for p in t.partitions
                ],
            )
            for t in req.topics
        ]

    def _fetch_group(
        self, group_id: str, topics: Any, require_stable: bool = False, member: Any = None
    ) -> tuple[E, list[dict[str, Any]]]:
        wanted = None if topics is None else [(t.name, list(t.partition_indexes)) for t in topics]
        try:
            shard = self._shard(group_id)
            if member is not None:  # v9+: a consumer-protocol member's epoch must be current
                stale = shard.validate_fetch(group_id, member.member_id, member.member_epoch)
                if stale is not None:
                    return stale, []
            found = shard.fetch_offsets(group_id, wanted)
        except CoordinatorError as e:
            return e.code, []
        unstable = shard.unstable_offsets(group_id) if require_stable else set()
        out = []
        for name, parts in found:
            rows = []
            for pid, v in parts:
                if (name, pid) in unstable:  # KIP-447: a transaction's offsets are pending
                    rows.append(
                        {
                            "partition_index": pid,
                            "committed_offset": -1,
                            "committed_leader_epoch": -1,
                            "metadata": "",
                            "error_code": E.unstable_offset_commit,
                        }
                    )
                    continue
                rows.append(
                    {
                        "partition_index": pid,
                        "committed_offset": v.offset if v else -1,
                        "committed_leader_epoch": v.leader_epoch if v else -1,
                        "metadata": v.metadata if v else "",
                        "error_code": E.none,
                    }
                )
            out.append({"name": name, "partitions": rows})
        return E.none, out

    async def _fetch(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        if header.api_version >= 8:
            groups = []
            for g in req.groups:
                code, topics = self._fetch_group(
                    g.group_id,
                    g.topics,
                    bool(getattr(req, "require_stable", False)),
                    g if header.api_version >= 9 else None,
                )
                groups.append({"group_id": g.group_id, "topics": topics, "error_code": code})
            return {"throttle_time": _ZERO, "groups": groups}
        code, topics = self._fetch_group(
            req.group_id, req.topics, bool(getattr(req, "require_stable", False))
        )
        if code != E.none and req.topics is not None:  # v1 has no top-level error: per partition
            topics = [
                {
                    "name": t.name,
                    "partitions": [
                        {
                            "partition_index": p,
                            "committed_offset": -1,
                            "committed_leader_epoch": -1,
                            "metadata": "",
                            "error_code": code,
                        }
                        for p in t.partition_indexes
                    ],
                }
                for t in req.topics
            ]
        return {"throttle_time": _ZERO, "topics": topics, "error_code": code}

    async def _list(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        states = {s.lower() for s in getattr(req, "states_filter", ()) or ()}
        types = {s.lower() for s in getattr(req, "types_filter", ()) or ()}
        groups: list[dict[str, Any]] = []
        for shard in self.runtime.loaded_shards():
            groups += shard.list_groups(states, types)
        code = E.none
        if any(s.loading for s in self.runtime.slots.values()):
            code = E.coordinator_load_in_progress
        return {"throttle_time": _ZERO, "error_code": code, "groups": groups}

    async def _describe(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        out = []
        for gid in req.groups:
            try:
                found = self._shard(gid).describe(gid)
            except CoordinatorError as e:
                found = {"error_code": e.code}
            if found is None:
                found = {"error_code": E.none, "group_state": "Dead"}
            out.append(
                {
                    "error_message": None,
                    "group_id": gid,
                    "group_state": "",
                    "protocol_type": "",
                    "protocol_data": "",
                    "members": [],
                    "authorized_operations": -2147483648,
                    **found,
                }
            )
        return {"throttle_time": _ZERO, "groups": out}

    async def _delete(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        results = []
        for gid in req.groups_names:
            code = E.none

            def fn(shard: Any, token: Any, now: int, gid: str = gid) -> Any:
                nonlocal code
                result, code = shard.delete_group(gid, now)
                return result.answer(token, {})

            try:
                await self._write(gid, fn)
            except CoordinatorError as e:
                code = e.code
            results.append({"group_id": gid, "error_code": code})
        return {"throttle_time": _ZERO, "results": results}

    async def _delete_offsets(self, header: RequestHeader, req: Any) -> dict[str, Any]:
        topics = [(t.name, [p.partition_index for p in t.partitions]) for t in req.topics]
        top, rows = E.none, []

        def fn(shard: Any, token: Any, now: int) -> Any:
            nonlocal top, rows
            result, top, rows = shard.delete_offsets(req.group_id, topics, now)
            return result.answer(token, {})

        try:
            await self._write(req.group_id, fn)
        except CoordinatorError as e:
            top = e.code
        return {
            "error_code": top,
            "throttle_time": _ZERO,
            "topics": [
                {
                    "name": name,
                    "partitions": [{"partition_index": p, "error_code": c} for p, c in parts],
                }
                for name, parts in rows
            ],
        }
