"""The group coordinator shard of one ``__consumer_offsets`` partition: classic groups
(:class:`~broker.coordinator.group.state_machine.GroupShard`) and consumer-protocol groups
(:class:`~broker.coordinator.group.consumer_group.ConsumerGroups`) side by side, still pure.

A group id is one type or the other, as in Kafka:

* ConsumerGroupHeartbeat on a classic group with members gets GROUP_ID_NOT_FOUND ("not a
  consumer group"); an empty classic group is replaced (its metadata tombstoned, its offsets
  kept) by the consumer group the first heartbeat creates.
* JoinGroup on a consumer group with members gets INCONSISTENT_GROUP_PROTOCOL; an empty consumer
  group is deleted and the classic group takes its place. SyncGroup, Heartbeat and LeaveGroup
  find no classic member there: UNKNOWN_MEMBER_ID. DescribeGroups says Dead (Kafka's answer
  before v6); ConsumerGroupDescribe on a classic group says GROUP_ID_NOT_FOUND.

Committed offsets of both types are the classic shard's offsets (same records, same
OffsetFetch); a consumer group's commit is checked against its member epochs first.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any

from kio.schema.errors import ErrorCode as E

from broker.coordinator.group.consumer_group import (
    ConsumerGroup,
    ConsumerGroupConfig,
    ConsumerGroups,
    HeartbeatRequest,
    TopicView,
)
from broker.coordinator.group.consumer_group import error as heartbeat_error
from broker.coordinator.group.consumer_records import AnyRecord, is_consumer_key
from broker.coordinator.group.records import GroupKey, OffsetKey
from broker.coordinator.group.state_machine import (
    EMPTY,
    CommitPartition,
    Group,
    GroupConfig,
    GroupShard,
    JoinRequest,
    Result,
    error_join,
)


class CoordinatorShard(GroupShard):
    """Classic and consumer-protocol groups of one ``__consumer_offsets`` partition."""

    def __init__(
        self,
        config: GroupConfig | None = None,
        consumer_config: ConsumerGroupConfig | None = None,
        new_id: Callable[[], str] | None = None,
    ) -> None:
        super().__init__(config, new_id)
        self.consumer = ConsumerGroups(consumer_config, new_id)

    # ---- replay --------------------------------------------------------------------------------
    def replay(self, record: Any) -> None:
        key, value = record
        if is_consumer_key(key):
            self.consumer.replay(key, value)
            self._drop_holder(key.group)
            return
        if isinstance(key, GroupKey) and value is None:
            # a group's metadata going away leaves its offsets (Kafka keeps them apart)
            g = self.groups.get(key.group)
            offsets = dict(g.offsets) if g is not None else {}
            super().replay(record)
            if offsets:
                self.groups[key.group] = Group(key.group, offsets=offsets)
            return
        super().replay(record)

    def on_loaded(self, now: int) -> None:
        super().on_loaded(now)
        self.consumer.on_loaded(now)

    def tick(self, now: int) -> Result:
        out = super().tick(now)
        self.consumer.tick(now, out.records)  # type: ignore[arg-type]  # one list, both families
        return out

    def next_deadline(self) -> int | None:
        times = [t for t in (super().next_deadline(), self.consumer.next_deadline()) if t]
        return min(times, default=None)

    def _consumer_group(self, group_id: str) -> ConsumerGroup | None:
        return self.consumer.groups.get(group_id)

    def _is_classic(self, group_id: str) -> bool:
        """A live classic group (members, or a pending join) holds this id."""
        g = self.groups.get(group_id)
        return g is not None and (g.state != EMPTY or bool(g.members) or bool(g.pending))

    # ---- ConsumerGroupHeartbeat / ConsumerGroupDescribe ----------------------------------------
    def consumer_heartbeat(
        self, req: HeartbeatRequest, topics: TopicView, token: Any, now: int
    ) -> Result:
        out = Result()
        bad = self.consumer.validate(req)
        if bad is not None:
            return out.answer(token, bad)
        gid = req.group_id
        if gid not in self.consumer.groups and gid in self.groups:
            if self._is_classic(gid) or req.member_epoch != 0:
                return out.answer(
                    token,
                    heartbeat_error(E.group_id_not_found, f"Group {gid} is not a consumer group."),
                )
            self._emit(out, (GroupKey(gid), None))  # an empty classic group gives way
        records: list[AnyRecord] = []
        resp = self.consumer.heartbeat(req, topics, now, records)
        out.records += records  # type: ignore[arg-type]  # one list, both families
        return out.answer(token, resp)

    def consumer_describe(self, group_id: str, names: Mapping[uuid.UUID, str]) -> dict[str, Any]:
        g = self._consumer_group(group_id)
        if g is None:
            why = "is not a consumer group" if self._is_classic(group_id) else "not found"
            return {
                "error_code": E.group_id_not_found,
                "error_message": f"Group {group_id} {why}.",
                "group_id": group_id,
            }
        return self.consumer.describe(g, names)

    # ---- classic APIs meeting a consumer group -------------------------------------------------
    def join(self, req: JoinRequest, token: Any, now: int) -> Result:
        g = self._consumer_group(req.group_id)
        if g is None:
            return super().join(req, token, now)
        if g.members:
            return Result().answer(token, error_join(E.inconsistent_group_protocol, req.member_id))
        out = Result()
        self._delete_consumer(req.group_id, out)
        result = super().join(req, token, now)
        result.records[:0] = out.records
        return result

    def _delete_consumer(self, group_id: str, out: Result) -> None:
        records: list[AnyRecord] = []
        self.consumer.delete(group_id, records)
        self._drop_holder(group_id)
        out.records += records  # type: ignore[arg-type]  # one list, both families

    def _drop_holder(self, group_id: str) -> None:
        """A deleted consumer group leaves no empty classic entry behind."""
        holder = self.groups.get(group_id)
        if group_id in self.consumer.groups or holder is None:
            return
        if not holder.offsets and not self._is_classic(group_id):
            del self.groups[group_id]

    def commit(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        instance_id: str | None,
        partitions: list[CommitPartition],
        now: int,
    ) -> tuple[Result, E | None, list[E]]:
        if self._consumer_group(group_id) is None:
            return super().commit(group_id, generation, member_id, instance_id, partitions, now)
        err = self.consumer.validate_commit(group_id, member_id, generation, 9)
        if err is not None:
            return Result(), err, []
        # checked against the member epochs: written as a simple commit to the offsets holder
        return super().commit(group_id, -1, "", None, partitions, now)

    def validate_fetch(self, group_id: str, member_id: str | None, epoch: int) -> E | None:
        """OffsetFetch v9+ from a consumer-protocol member: its epoch must be current."""
        if self._consumer_group(group_id) is None:
            return None
        return self.consumer.validate_fetch(group_id, member_id, epoch)

    def list_groups(self, states: set[str], types: set[str]) -> list[dict[str, Any]]:
        out = [
            g
            for g in super().list_groups(states, types)
            if g["group_id"] not in self.consumer.groups
        ]
        if types and "consumer" not in types:
            return out
        for cg in self.consumer.groups.values():
            if states and cg.state.lower() not in states:
                continue
            out.append(self.consumer.listing(cg))
        return out

    def describe(self, group_id: str) -> dict[str, Any] | None:
        if self._consumer_group(group_id) is not None:
            return None  # DescribeGroups (v0-v5) on a consumer group: Dead, as Kafka answers
        return super().describe(group_id)

    def delete_group(self, group_id: str, now: int) -> tuple[Result, E]:
        g = self._consumer_group(group_id)
        if g is None:
            return super().delete_group(group_id, now)
        out = Result()
        if g.members:
            return out, E.non_empty_group
        holder = self.groups.get(group_id)
        for t, p in sorted(holder.offsets if holder is not None else {}):
            self._emit(out, (OffsetKey(group_id, t, p), None))
        self._delete_consumer(group_id, out)
        return out, E.none

    def delete_offsets(
        self, group_id: str, topics: list[tuple[str, list[int]]], now: int
    ) -> tuple[Result, E, list[tuple[str, list[tuple[int, E]]]]]:
        g = self._consumer_group(group_id)
        if g is None:
            return super().delete_offsets(group_id, topics, now)
        out = Result()
        subscribed = g.subscribed()
        holder = self.groups.get(group_id)
        offsets = holder.offsets if holder is not None else {}
        rows = []
        for t, parts in topics:
            row = []
            for p in parts:
                if t in subscribed:
                    row.append((p, E.group_subscribed_to_topic))
                    continue
                if (t, p) in offsets:
                    self._emit(out, (OffsetKey(group_id, t, p), None))
                row.append((p, E.none))
            rows.append((t, row))
        return out, E.none, rows

    def expire_offsets(self, now: int) -> Result:
        """Classic expiry for classic groups; a consumer group's offset expires once no member
        subscribes to its topic and it is older than the retention; an empty consumer group
        with no offsets left is deleted."""
        hidden = {gid: self.groups.pop(gid) for gid in self.consumer.groups if gid in self.groups}
        try:
            out = super().expire_offsets(now)
        finally:
            self.groups.update(hidden)
        horizon = now - self.config.offsets_retention_ms
        for gid, cg in list(self.consumer.groups.items()):
            subscribed = cg.subscribed()
            holder = self.groups.get(gid)
            for (t, p), v in sorted(holder.offsets.items() if holder is not None else []):
                if t not in subscribed and v.commit_timestamp < horizon:
                    self._emit(out, (OffsetKey(gid, t, p), None))
            left = self.groups.get(gid)
            if not cg.members and (left is None or not left.offsets):
                self._delete_consumer(gid, out)
        return out
