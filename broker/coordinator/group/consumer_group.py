"""Consumer-protocol (KIP-848) groups of one ``__consumer_offsets`` partition, as a pure state
machine: ``heartbeat(request, topics, now, out) -> response``, the records appended to ``out``
(and already replayed by :meth:`ConsumerGroups.replay`, the only mutation of persisted state).

A member heartbeats with its member epoch (0 joins, -1 leaves, -2 leaves for now as a static
member) and, when they changed, its subscription and the partitions it owns. The group epoch
goes up when a member joins, leaves or changes its subscription, or when a subscribed topic
appears or changes its partition count. Then the server-side assignor computes a new *target
assignment* (its epoch becomes the group epoch), and each member is reconciled towards its
target one heartbeat at a time, incrementally: it first keeps only the partitions it owns that
are still its target; those no longer its target are *pending revocation* until a heartbeat no
longer lists them as owned; a target partition another member still holds is *unreleased* and
given only once released. A member that does not heartbeat within
``group.consumer.session.timeout.ms``, or does not revoke within its rebalance timeout, is
fenced (removed), which bumps the group epoch.

Group states as Kafka names them: Empty (no members), Assigning (group epoch ahead of the
target assignment), Reconciling (some member not yet at the target), Stable. Session and
revocation deadlines live in memory only, and restart from the load time.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode as E

from broker.coordinator.group.assignors import ASSIGNORS, parse_assignors
from broker.coordinator.group.consumer_records import (
    AnyRecord,
    CGCurrentAssignmentKey,
    CGCurrentAssignmentValue,
    CGMemberKey,
    CGMemberValue,
    CGMetadataKey,
    CGMetadataValue,
    CGPartitionMetadataKey,
    CGPartitionMetadataValue,
    CGTargetMemberKey,
    CGTargetMemberValue,
    CGTargetMetadataKey,
    CGTargetMetadataValue,
    ConsumerKey,
    ConsumerValue,
    Partitions,
    TopicMetadata,
    partitions_of,
)
from kraft.config import ConfigError

EMPTY, ASSIGNING, RECONCILING, STABLE, DEAD = "Empty", "Assigning", "Reconciling", "Stable", "Dead"
# member states (MemberState in Kafka, stored as int8)
M_STABLE, M_UNREVOKED, M_UNRELEASED = 0, 1, 2
LEAVE_EPOCH, STATIC_LEAVE_EPOCH = -1, -2
# topic name -> (topic id, partition count), for every topic of the metadata image
TopicView = Mapping[str, tuple[uuid.UUID, int]]
Owned = dict[uuid.UUID, set[int]]


@dataclass(frozen=True)
class ConsumerGroupConfig:
    """Kafka's consumer-protocol group settings (same names with dots)."""

    session_timeout_ms: int = 45_000  # group.consumer.session.timeout.ms
    heartbeat_interval_ms: int = 5_000  # group.consumer.heartbeat.interval.ms
    assignors: tuple[str, ...] = ("uniform", "range")  # group.consumer.assignors
    max_size: int = 2**31 - 1  # group.consumer.max.size


def consumer_group_config(config: Any) -> ConsumerGroupConfig:
    """The settings from a broker config (a mapping, or an object with ``values``); Kafka's
    default for each key the config does not declare."""
    values = config if isinstance(config, Mapping) else getattr(config, "values", config)
    d = ConsumerGroupConfig()

    def get(key: str, default: Any) -> Any:
        try:
            return values[key]
        except KeyError:
            return default

    try:
        assignors = parse_assignors(get("group.consumer.assignors", d.assignors))
    except ValueError as e:
        raise ConfigError(f"group.consumer.assignors: {e}") from None
    return ConsumerGroupConfig(
        session_timeout_ms=int(get("group.consumer.session.timeout.ms", d.session_timeout_ms)),
        heartbeat_interval_ms=int(
            get("group.consumer.heartbeat.interval.ms", d.heartbeat_interval_ms)
        ),
        assignors=assignors,
        max_size=int(get("group.consumer.max.size", d.max_size)),
    )


@dataclass(frozen=True)
class HeartbeatRequest:
    """ConsumerGroupHeartbeat, version-independent; None = unchanged since the last one."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    topics: tuple[str, ...] | None = None
    regex: str | None = None
    server_assignor: str | None = None
    owned: Partitions | None = None
    client_id: str = ""
    client_host: str = ""
    version: int = 1


@dataclass
class Member:
    member_id: str
    meta: CGMemberValue = field(
        default_factory=lambda: CGMemberValue(None, None, "", "", (), None, -1, None)
    )
    epoch: int = 0
    previous_epoch: int = 0
    state: int = M_STABLE
    assigned: Owned = field(default_factory=dict)
    revoking: Owned = field(default_factory=dict)
    session_deadline: int = 0
    revoke_deadline: int = 0  # while M_UNREVOKED: fenced if still revoking then

    def current(self) -> CGCurrentAssignmentValue:
        return CGCurrentAssignmentValue(
            self.epoch,
            self.previous_epoch,
            self.state,
            partitions_of(self.assigned),
            partitions_of(self.revoking),
        )


@dataclass
class ConsumerGroup:
    group_id: str
    epoch: int = 0
    assignment_epoch: int = 0
    topics: dict[str, tuple[uuid.UUID, int]] = field(default_factory=dict)
    members: dict[str, Member] = field(default_factory=dict)
    target: dict[str, Owned] = field(default_factory=dict)
    owners: dict[tuple[uuid.UUID, int], str] = field(default_factory=dict)

    @property
    def state(self) -> str:
        if not self.members:
            return EMPTY
        if self.epoch > self.assignment_epoch:
            return ASSIGNING
        for m in self.members.values():
            if m.state != M_STABLE or m.epoch != self.assignment_epoch:
                return RECONCILING
        return STABLE

    def subscribed(self, topics: TopicView | None = None) -> set[str]:
        """Topic names any member subscribes to (regexes resolved against ``topics``)."""
        out: set[str] = set()
        for m in self.members.values():
            out |= resolve(m.meta, topics if topics is not None else self.topics)
        return out


def resolve(meta: CGMemberValue, topics: Mapping[str, Any]) -> set[str]:
    """The topic names a member subscribes to: its names, plus the topics its regex matches."""
    out = set(meta.topics)
    if meta.regex:
        try:
            pattern = re.compile(meta.regex)
        except re.error:
            return out
        out |= {t for t in topics if pattern.fullmatch(t) and not t.startswith("__")}
    return out


def error(code: E, message: str | None = None, member_id: str | None = None) -> dict[str, Any]:
    return {
        "error_code": code,
        "error_message": message,
        "member_id": member_id,
        "member_epoch": -1,
        "heartbeat_interval": timedelta(0),
        "assignment": None,
    }


def _owned(parts: Partitions | None) -> Owned:
    return {t: set(ps) for t, ps in parts or ()}


class ConsumerGroups:
    """The consumer-protocol groups of one shard."""

    def __init__(
        self, config: ConsumerGroupConfig | None = None, new_id: Callable[[], str] | None = None
    ) -> None:
        self.config = config or ConsumerGroupConfig()
        self.groups: dict[str, ConsumerGroup] = {}
        self._new_id = new_id or (lambda: str(uuid.uuid4()))

    # ---- replay -------------------------------------------------------------------------------
    def replay(self, key: ConsumerKey, value: ConsumerValue | None) -> None:
        if isinstance(key, CGMetadataKey) and value is None:
            self.groups.pop(key.group, None)
            return
        g = self.groups.get(key.group)
        if g is None:
            if value is None:
                return
            g = self.groups[key.group] = ConsumerGroup(key.group)
        if isinstance(value, CGMetadataValue):
            g.epoch = value.epoch
        elif isinstance(key, CGPartitionMetadataKey):
            assert value is None or isinstance(value, CGPartitionMetadataValue)
            g.topics = {t.name: (t.topic_id, t.partitions) for t in value.topics} if value else {}
        elif isinstance(key, CGTargetMetadataKey):
            assert value is None or isinstance(value, CGTargetMetadataValue)
            g.assignment_epoch = value.assignment_epoch if value else 0
        elif isinstance(key, CGTargetMemberKey):
            if value is None:
                g.target.pop(key.member_id, None)
            else:
                assert isinstance(value, CGTargetMemberValue)
                g.target[key.member_id] = _owned(value.partitions)
        elif isinstance(key, CGMemberKey):
            if value is None:
                m = g.members.pop(key.member_id, None)
                if m is not None:
                    self._set_owner(g, m, {}, {})
            else:
                assert isinstance(value, CGMemberValue)
                g.members.setdefault(key.member_id, Member(key.member_id)).meta = value
        elif isinstance(key, CGCurrentAssignmentKey):
            m = g.members.setdefault(key.member_id, Member(key.member_id))
            if value is None:
                m.epoch = m.previous_epoch = 0
                m.state = M_STABLE
                self._set_owner(g, m, {}, {})
            else:
                assert isinstance(value, CGCurrentAssignmentValue)
                m.epoch, m.previous_epoch = value.member_epoch, value.previous_member_epoch
                m.state = value.state
                self._set_owner(g, m, _owned(value.assigned), _owned(value.revoking))

    @staticmethod
    def _set_owner(g: ConsumerGroup, m: Member, assigned: Owned, revoking: Owned) -> None:
        for parts in (m.assigned, m.revoking):
            for t, ps in parts.items():
                for p in ps:
                    if g.owners.get((t, p)) == m.member_id:
                        del g.owners[(t, p)]
        m.assigned, m.revoking = assigned, revoking
        for parts in (assigned, revoking):
            for t, ps in parts.items():
                for p in ps:
                    g.owners[(t, p)] = m.member_id

    def _emit(self, out: list[AnyRecord], key: ConsumerKey, value: ConsumerValue | None) -> None:
        out.append((key, value))
        self.replay(key, value)

    def on_loaded(self, now: int) -> None:
        for g in self.groups.values():
            for m in g.members.values():
                m.session_deadline = now + self.config.session_timeout_ms
                if m.state == M_UNREVOKED:
                    m.revoke_deadline = now + max(0, m.meta.rebalance_timeout_ms)

    # ---- ConsumerGroupHeartbeat ---------------------------------------------------------------
    def validate(self, req: HeartbeatRequest) -> dict[str, Any] | None:
        """Kafka's INVALID_REQUEST / UNSUPPORTED_ASSIGNOR checks, before any state is read."""
        bad = None
        if not req.group_id:
            bad = "GroupId can't be empty."
        elif req.instance_id == "":
            bad = "InstanceId can't be empty."
        elif req.rack_id == "":
            bad = "RackId can't be empty."
        elif req.member_epoch > 0 or req.member_epoch == LEAVE_EPOCH:
            if not req.member_id:
                bad = "MemberId can't be empty."
        elif req.member_epoch == 0:
            if not req.member_id and req.version >= 1:
                bad = "MemberId can't be empty."
            elif req.rebalance_timeout_ms == -1:
                bad = "RebalanceTimeoutMs must be provided in first request."
            elif req.owned is None or req.owned:
                bad = "TopicPartitions must be empty when (re-)joining."
            elif not req.topics and not req.regex:
                bad = "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."
        elif req.member_epoch == STATIC_LEAVE_EPOCH:
            if not req.member_id:
                bad = "MemberId can't be empty."
            elif req.instance_id is None:
                bad = "InstanceId can't be null."
        else:
            bad = "MemberEpoch is invalid."
        if bad:
            return error(E.invalid_request, bad)
        if req.server_assignor is not None and req.server_assignor not in self.config.assignors:
            return error(
                E.unsupported_assignor,
                f"ServerAssignor {req.server_assignor} is not supported. Supported assignors: "
                f"{', '.join(self.config.assignors)}.",
            )
        if req.regex:
            try:
                re.compile(req.regex)
            except re.error as e:
                return error(E.invalid_regular_expression, f"SubscribedTopicRegex is invalid: {e}")
        return None

    def heartbeat(
        self, req: HeartbeatRequest, topics: TopicView, now: int, out: list[AnyRecord]
    ) -> dict[str, Any]:
        """One ConsumerGroupHeartbeat (already past :meth:`validate`)."""
        if req.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(req, topics, now, out)
        gid = req.group_id
        g = self.groups.get(gid)
        if g is None and req.member_epoch != 0:
            return error(E.group_id_not_found, f"Consumer group {gid} not found.")
        member_id = req.member_id or self._new_id()
        m = g.members.get(member_id) if g is not None else None
        replaced: CGMemberValue | None = None  # a static member's old subscription
        if req.member_epoch == 0:
            if m is None and g is not None and len(g.members) >= self.config.max_size:
                return error(
                    E.group_max_size_reached,
                    f"The consumer group has reached its maximum capacity of "
                    f"{self.config.max_size} members.",
                )
            if req.instance_id and g is not None:
                holder = next(
                    (
                        o
                        for o in g.members.values()
                        if o.meta.instance_id == req.instance_id and o.member_id != member_id
                    ),
                    None,
                )
                if holder is not None:
                    if holder.epoch != STATIC_LEAVE_EPOCH:
                        return error(
                            E.unreleased_instance_id,
                            f"Static member {holder.member_id} with instance id "
                            f"{req.instance_id} is not released yet.",
                        )
                    replaced = self._replace_static(g, holder, member_id, out)
        else:
            assert g is not None
            if m is None:
                return error(
                    E.unknown_member_id, f"Member {member_id} is not a member of group {gid}."
                )
            if req.member_epoch > m.epoch or (
                req.member_epoch < m.epoch
                and (
                    req.member_epoch != m.previous_epoch
                    or not _subset(_owned(req.owned) if req.owned is not None else None, m.assigned)
                )
            ):
                return error(
                    E.fenced_member_epoch,
                    f"The consumer group member has a member epoch ({req.member_epoch}) "
                    f"different from the one known by the group coordinator ({m.epoch}). The "
                    f"member must abandon all its partitions and rejoin.",
                )
        if g is None:
            g = self.groups[gid] = ConsumerGroup(gid)
        known = m is not None
        old = m.meta if m is not None else replaced
        base = old or CGMemberValue(None, None, "", "", (), None, -1, None)
        new = CGMemberValue(
            req.instance_id if req.instance_id is not None else base.instance_id,
            req.rack_id if req.rack_id is not None else base.rack_id,
            req.client_id,
            req.client_host,
            tuple(sorted(set(req.topics))) if req.topics is not None else base.topics,
            (req.regex or None) if req.regex is not None else base.regex,
            req.rebalance_timeout_ms
            if req.rebalance_timeout_ms != -1
            else base.rebalance_timeout_ms,
            req.server_assignor if req.server_assignor is not None else base.server_assignor,
        )
        bump = False
        if new != old:
            self._emit(out, CGMemberKey(gid, member_id), new)
            bump = old is None or (new.topics, new.regex) != (old.topics, old.regex)
        m = g.members[member_id]
        if known and req.member_epoch == 0 and (m.epoch or m.assigned or m.revoking):
            # a known member rejoining from scratch: it owns nothing any more
            self._emit(out, CGCurrentAssignmentKey(gid, member_id), None)
        bump = self._refresh_topics(g, topics, out) or bump
        if bump:
            self._emit(out, CGMetadataKey(gid), CGMetadataValue(g.epoch + 1))
        if g.epoch > g.assignment_epoch:
            self._assign(g, topics, out)
        before = partitions_of(m.assigned)
        self._reconcile(g, m, _owned(req.owned) if req.owned is not None else None, now, out)
        m.session_deadline = now + self.config.session_timeout_ms
        full = req.member_epoch == 0 or (
            req.rebalance_timeout_ms != -1 and req.topics is not None and req.owned is not None
        )
        resp: dict[str, Any] = {
            "error_code": E.none,
            "error_message": None,
            "member_id": member_id,
            "member_epoch": m.epoch,
            "heartbeat_interval": timedelta(milliseconds=self.config.heartbeat_interval_ms),
            "assignment": None,
        }
        if full or partitions_of(m.assigned) != before:
            resp["assignment"] = partitions_of(m.assigned)
        return resp

    def _replace_static(
        self, g: ConsumerGroup, old: Member, member_id: str, out: list[AnyRecord]
    ) -> CGMemberValue:
        """A static member that left with epoch -2 comes back under a new member id: the new
        id takes over its target and partitions (no rebalance unless its subscription changes).
        Returns the old member's subscription, to compare the new one with."""
        gid, target = g.group_id, partitions_of(g.target.get(old.member_id, {}))
        assigned, meta = partitions_of(old.assigned), old.meta
        self._emit(out, CGCurrentAssignmentKey(gid, old.member_id), None)
        self._emit(out, CGTargetMemberKey(gid, old.member_id), None)
        self._emit(out, CGMemberKey(gid, old.member_id), None)
        self._emit(out, CGMemberKey(gid, member_id), meta)
        self._emit(out, CGTargetMemberKey(gid, member_id), CGTargetMemberValue(target))
        value = CGCurrentAssignmentValue(0, 0, M_STABLE, assigned, ())
        self._emit(out, CGCurrentAssignmentKey(gid, member_id), value)
        return meta

    def _refresh_topics(self, g: ConsumerGroup, topics: TopicView, out: list[AnyRecord]) -> bool:
        """Write the subscribed topics' metadata if it changed (then the epoch must go up)."""
        wanted = {t: topics[t] for t in sorted(g.subscribed(topics)) if t in topics}
        if wanted == g.topics:
            return False
        value = CGPartitionMetadataValue(
            tuple(TopicMetadata(tid, name, n) for name, (tid, n) in wanted.items())
        )
        self._emit(out, CGPartitionMetadataKey(g.group_id), value)
        return True

    def assignor_of(self, g: ConsumerGroup) -> str:
        """The assignor most members ask for (ties: config order), else the default."""
        votes: dict[str, int] = {}
        for m in g.members.values():
            name = m.meta.server_assignor
            if name in self.config.assignors:
                votes[name] = votes.get(name, 0) + 1
        if not votes:
            return self.config.assignors[0]
        return max(
            self.config.assignors, key=lambda n: (votes.get(n, 0), -self.config.assignors.index(n))
        )

    def _assign(self, g: ConsumerGroup, topics: TopicView, out: list[AnyRecord]) -> None:
        subs = {
            mid: frozenset(t for t in resolve(m.meta, topics) if t in g.topics)
            for mid, m in g.members.items()
        }
        target = ASSIGNORS[self.assignor_of(g)](subs, g.topics, g.target)
        for mid in sorted(g.members):
            value = partitions_of(target.get(mid, {}))
            if partitions_of(g.target.get(mid, {})) != value or mid not in g.target:
                self._emit(out, CGTargetMemberKey(g.group_id, mid), CGTargetMemberValue(value))
        self._emit(out, CGTargetMetadataKey(g.group_id), CGTargetMetadataValue(g.epoch))

    def _reconcile(
        self, g: ConsumerGroup, m: Member, owned: Owned | None, now: int, out: list[AnyRecord]
    ) -> None:
        """Move ``m`` towards its target (Kafka's CurrentAssignmentBuilder rules)."""
        target_epoch = g.assignment_epoch
        if m.state == M_STABLE and m.epoch == target_epoch:
            return
        if m.state == M_UNREVOKED:
            if _still_owns(owned, m.revoking):
                return
            epoch = m.epoch + 1  # revoked: it may move on to the next epoch
        else:
            epoch = m.epoch
        target = g.target.get(m.member_id, {})
        assigned: Owned = {}
        revoking: Owned = {}
        pending: Owned = {}
        unreleased = False
        for t in set(target) | set(m.assigned):
            want, have = target.get(t, set()), m.assigned.get(t, set())
            keep = have & want
            if keep:
                assigned[t] = set(keep)
            if have - keep:
                revoking[t] = have - keep
            free = set()
            for p in want - keep:
                holder = g.owners.get((t, p))
                if holder is not None and holder != m.member_id:
                    unreleased = True
                else:
                    free.add(p)
            if free:
                pending[t] = free
        value: CGCurrentAssignmentValue
        if revoking and _still_owns(owned, revoking):
            state, new_epoch = M_UNREVOKED, epoch
        else:
            revoking = {}
            for t, ps in pending.items():
                assigned.setdefault(t, set()).update(ps)
            state, new_epoch = (M_UNRELEASED if unreleased else M_STABLE), target_epoch
        previous = m.epoch if new_epoch != m.epoch else m.previous_epoch
        value = CGCurrentAssignmentValue(
            new_epoch, previous, state, partitions_of(assigned), partitions_of(revoking)
        )
        if value != m.current():
            self._emit(out, CGCurrentAssignmentKey(g.group_id, m.member_id), value)
        if state == M_UNREVOKED:
            if not m.revoke_deadline:
                m.revoke_deadline = now + max(0, m.meta.rebalance_timeout_ms)
        else:
            m.revoke_deadline = 0

    # ---- leaving and fencing ------------------------------------------------------------------
    def _leave(
        self, req: HeartbeatRequest, topics: TopicView, now: int, out: list[AnyRecord]
    ) -> dict[str, Any]:
        g = self.groups.get(req.group_id)
        if g is None:
            return error(E.group_id_not_found, f"Consumer group {req.group_id} not found.")
        if req.instance_id:
            m = next((o for o in g.members.values() if o.meta.instance_id == req.instance_id), None)
            if m is None:
                return error(
                    E.unknown_member_id, f"Instance id {req.instance_id} is unknown.", req.member_id
                )
            if m.member_id != req.member_id:
                return error(
                    E.fenced_instance_id,
                    f"Static member {req.member_id} with instance id {req.instance_id} was "
                    f"fenced by member {m.member_id}.",
                    req.member_id,
                )
        else:
            found = g.members.get(req.member_id)
            if found is None:
                return error(
                    E.unknown_member_id,
                    f"Member {req.member_id} is not a member of group {req.group_id}.",
                    req.member_id,
                )
            m = found
        if req.member_epoch == STATIC_LEAVE_EPOCH:
            value = CGCurrentAssignmentValue(
                STATIC_LEAVE_EPOCH, m.previous_epoch, m.state, partitions_of(m.assigned), ()
            )
            self._emit(out, CGCurrentAssignmentKey(g.group_id, m.member_id), value)
        else:
            self.fence(g, m.member_id, topics, out)
        return {
            "error_code": E.none,
            "error_message": None,
            "member_id": req.member_id,
            "member_epoch": req.member_epoch,
            "heartbeat_interval": timedelta(0),
            "assignment": None,
        }

    def fence(
        self, g: ConsumerGroup, member_id: str, topics: TopicView | None, out: list[AnyRecord]
    ) -> None:
        """Remove a member (left, session expired, did not revoke in time): its records'
        tombstones, then a new group epoch so the others get its partitions."""
        gid = g.group_id
        self._emit(out, CGCurrentAssignmentKey(gid, member_id), None)
        self._emit(out, CGTargetMemberKey(gid, member_id), None)
        self._emit(out, CGMemberKey(gid, member_id), None)
        self._refresh_topics(g, topics if topics is not None else g.topics, out)
        self._emit(out, CGMetadataKey(gid), CGMetadataValue(g.epoch + 1))

    def tick(self, now: int, out: list[AnyRecord]) -> None:
        """Fence members whose session expired or who did not revoke in time."""
        for g in list(self.groups.values()):
            for m in list(g.members.values()):
                late = m.session_deadline and m.session_deadline <= now
                stuck = m.state == M_UNREVOKED and m.revoke_deadline and m.revoke_deadline <= now
                if late or stuck:
                    self.fence(g, m.member_id, None, out)

    def next_deadline(self) -> int | None:
        times = []
        for g in self.groups.values():
            for m in g.members.values():
                if m.session_deadline:
                    times.append(m.session_deadline)
                if m.state == M_UNREVOKED and m.revoke_deadline:
                    times.append(m.revoke_deadline)
        return min(times, default=None)

    def delete(self, gid: str, out: list[AnyRecord]) -> None:
        """Tombstones of an empty group's records (its offsets are the caller's)."""
        self._emit(out, CGTargetMetadataKey(gid), None)
        self._emit(out, CGPartitionMetadataKey(gid), None)
        self._emit(out, CGMetadataKey(gid), None)

    # ---- offsets and admin --------------------------------------------------------------------
    def validate_commit(self, gid: str, member_id: str, epoch: int, version: int) -> E | None:
        """None if this OffsetCommit may write to consumer group ``gid``, else Kafka's error."""
        g = self.groups[gid]
        if epoch < 0 and not g.members:
            return None  # admin tools / assign-mode consumers, while the group is empty
        m = g.members.get(member_id)
        if m is None:
            return E.unknown_member_id
        if version < 9:
            return E.unsupported_version
        if epoch != m.epoch:
            return E.stale_member_epoch
        return None

    def validate_fetch(self, gid: str, member_id: str | None, epoch: int) -> E | None:
        """None if this OffsetFetch (v9+ names a member) may read ``gid``'s offsets."""
        if member_id is None or (epoch < 0 and not member_id):
            return None
        g = self.groups[gid]
        m = g.members.get(member_id)
        if m is None:
            return E.unknown_member_id
        if epoch != m.epoch:
            return E.stale_member_epoch
        return None

    def listing(self, g: ConsumerGroup) -> dict[str, Any]:
        return {
            "group_id": g.group_id,
            "protocol_type": "consumer",
            "group_state": g.state,
            "group_type": "consumer",
        }

    def describe(self, g: ConsumerGroup, names: Mapping[uuid.UUID, str]) -> dict[str, Any]:
        """A ConsumerGroupDescribe ``DescribedGroup`` (topic names from ``names``)."""
        by_id = {tid: name for name, (tid, _) in g.topics.items()} | dict(names)

        def parts(p: Owned) -> list[dict[str, Any]]:
            return [
                {"topic_id": t, "topic_name": by_id.get(t, ""), "partitions": list(ps)}
                for t, ps in partitions_of(p)
            ]

        return {
            "error_code": E.none,
            "error_message": None,
            "group_id": g.group_id,
            "group_state": g.state,
            "group_epoch": g.epoch,
            "assignment_epoch": g.assignment_epoch,
            "assignor_name": self.assignor_of(g),
            "members": [
                {
                    "member_id": m.member_id,
                    "instance_id": m.meta.instance_id,
                    "rack_id": m.meta.rack_id,
                    "member_epoch": m.epoch,
                    "client_id": m.meta.client_id,
                    "client_host": m.meta.client_host,
                    "subscribed_topic_names": list(m.meta.topics),
                    "subscribed_topic_regex": m.meta.regex,
                    "assignment": {"topic_partitions": parts(m.assigned)},
                    "target_assignment": {"topic_partitions": parts(g.target.get(mid, {}))},
                    "member_type": 1,
                }
                for mid, m in sorted(g.members.items())
            ],
            "authorized_operations": -2147483648,
        }


def _subset(owned: Owned | None, assigned: Owned) -> bool:
    if owned is None:
        return False
    return all(ps <= assigned.get(t, set()) for t, ps in owned.items())


def _still_owns(owned: Owned | None, revoking: Owned) -> bool:
    """Does the member (by its reported owned partitions) still hold one it must revoke?
    Unknown (None: not reported) counts as yes, as in Kafka."""
    if owned is None:
        return True
    return any(ps & revoking.get(t, set()) for t, ps in owned.items())
