"""The classic group coordinator of one ``__consumer_offsets`` partition, as a pure state machine.

Every request is ``method(request, token, now_ms) -> Result``: the records to append (already
replayed into this shard by :meth:`GroupShard._emit`, which calls :meth:`GroupShard.replay`, the
only mutation of persisted state) and the responses it completes, each paired with the opaque
token of the request it answers. A request may stay pending (JoinGroup waiting for the other
members, SyncGroup waiting for the leader); a later request or :meth:`GroupShard.tick` completes
it. What Kafka keeps only in memory stays in memory here too (pending joins, heartbeat
deadlines); what it writes to ``__consumer_offsets`` (group metadata with members and
assignments, committed offsets, tombstones) is replayed from those records when a broker loads
the partition. No I/O, no clock but ``now_ms``; member ids come from an injected generator.

States: Empty -> PreparingRebalance -> CompletingRebalance -> Stable, and Dead (deleted).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode as E

from broker.coordinator.group.records import (
    GroupKey,
    GroupValue,
    MemberValue,
    OffsetKey,
    OffsetValue,
    Record,
)

EMPTY, PREPARING, COMPLETING, STABLE, DEAD = (
    "Empty",
    "PreparingRebalance",
    "CompletingRebalance",
    "Stable",
    "Dead",
)
NO_GENERATION = -1


@dataclass(frozen=True)
class GroupConfig:
    """Kafka's group settings (same names with dots)."""

    min_session_timeout_ms: int = 6000  # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1_800_000  # group.max.session.timeout.ms
    initial_rebalance_delay_ms: int = 3000  # group.initial.rebalance.delay.ms
    max_size: int = 2**31 - 1  # group.max.size
    offset_metadata_max_bytes: int = 4096  # offset.metadata.max.bytes
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000  # offsets.retention.minutes


# ---- requests (version-independent) ------------------------------------------------------------


@dataclass(frozen=True)
class JoinRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    client_id: str = ""
    client_host: str = ""
    require_known_member_id: bool = True  # v4+


@dataclass(frozen=True)
class SyncRequest:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None
    protocol_type: str | None
    protocol_name: str | None
    assignments: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class CommitPartition:
    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str | None


@dataclass
class Result:
    records: list[Record] = field(default_factory=list)
    completions: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)
    producer: tuple[int, int] | None = None  # (id, epoch): append as that transaction's batch
    events: list[str] = field(default_factory=list)  # membership changes, for the broker's log

    def answer(self, token: Any, response: dict[str, Any]) -> Result:
        self.completions.append((token, response))
        return self

    def note(self, event: str) -> None:
        self.events.append(event)


# ---- state --------------------------------------------------------------------------------------


@dataclass
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    assignment: bytes = b""
    join_token: Any = None
    sync_token: Any = None
    heartbeat_deadline: int = 0

    def metadata(self, protocol: str | None) -> bytes:
        return next((m for n, m in self.protocols if n == protocol), b"")


@dataclass
class Group:
    group_id: str
    state: str = EMPTY
    protocol_type: str | None = None
    protocol: str | None = None
    generation: int = 0
    leader: str | None = None
    state_timestamp: int = -1
    members: dict[str, Member] = field(default_factory=dict)
    static: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member id
    pending: dict[str, int] = field(default_factory=dict)  # MEMBER_ID_REQUIRED ids -> deadline
    offsets: dict[tuple[str, int], OffsetValue] = field(default_factory=dict)
    rebalance_deadline: int = 0
    initial_delay_until: int = 0


def error_join(code: E, member_id: str = "") -> dict[str, Any]:
    return {
        "error_code": code,
        "generation_id": NO_GENERATION,
        "protocol_type": None,
        "protocol_name": None,
        "leader": "",
        "skip_assignment": False,
        "member_id": member_id,
        "members": [],
    }


def error_sync(code: E) -> dict[str, Any]:
    return {"error_code": code, "protocol_type": None, "protocol_name": None, "assignment": b""}


def subscribed_topics(subscription: bytes) -> set[str]:
    """Topics of a ConsumerProtocolSubscription (empty set if unreadable)."""
    try:
        pos = 2
        (count,) = struct.unpack_from(">i", subscription, pos)
        pos += 4
        out = set()
        for _ in range(max(0, count)):
            (n,) = struct.unpack_from(">h", subscription, pos)
            pos += 2
            out.add(subscription[pos : pos + n].decode("utf-8", "replace"))
            pos += n
        return out
    except struct.error:
        return set()


class GroupShard:
    """The groups of one ``__consumer_offsets`` partition."""

    def __init__(
        self, config: GroupConfig | None = None, new_id: Callable[[], str] | None = None
    ) -> None:
        self.config = config or GroupConfig()
        self.groups: dict[str, Group] = {}
        self._new_id = new_id or (lambda: str(uuid.uuid4()))
        # TxnOffsetCommit: producer id -> (group, topic, partition) -> offset, until its marker
        self.pending_txn: dict[int, dict[tuple[str, str, int], OffsetValue]] = {}

    # ---- replay (the only mutation of persisted state) ---------------------------------------
    def replay(self, record: Record) -> None:
        key, value = record
        if isinstance(key, OffsetKey):
            if value is None:
                g = self.groups.get(key.group)
                if g is not None:
                    g.offsets.pop((key.topic, key.partition), None)
            else:
                assert isinstance(value, OffsetValue)
                g = self.groups.setdefault(key.group, Group(key.group))
                g.offsets[(key.topic, key.partition)] = value
            return
        assert isinstance(key, GroupKey)
        if value is None:
            g = self.groups.pop(key.group, None)
            if g is not None:
                g.state = DEAD
            return
        assert isinstance(value, GroupValue)
        g = self.groups.setdefault(key.group, Group(key.group))
        g.protocol_type = value.protocol_type
        g.generation = value.generation
        g.protocol = value.protocol
        g.leader = value.leader
        g.state_timestamp = value.current_state_timestamp
        keep = {m.member_id for m in value.members}
        for mid in [mid for mid in g.members if mid not in keep]:
            self._drop_member(g, mid)
        for mv in value.members:
            m = g.members.get(mv.member_id)
            if m is None:
                m = g.members[mv.member_id] = Member(
                    mv.member_id,
                    mv.group_instance_id,
                    mv.client_id,
                    mv.client_host,
                    mv.rebalance_timeout,
                    mv.session_timeout,
                    value.protocol_type,
                    ((value.protocol or "", mv.subscription),),
                )
                if mv.group_instance_id:
                    g.static[mv.group_instance_id] = mv.member_id
            m.assignment = mv.assignment
        g.state = STABLE if g.members else EMPTY

    def on_loaded(self, now: int) -> None:
        """Loading finished: members read from the log get a full session from now."""
        for g in self.groups.values():
            for m in g.members.values():
                m.heartbeat_deadline = now + m.session_timeout_ms

    def pending_tokens(self) -> list[Any]:
        """Tokens of every request still waiting (answered NOT_COORDINATOR on unload)."""
        out = []
        for g in self.groups.values():
            for m in g.members.values():
                out += [t for t in (m.join_token, m.sync_token) if t is not None]
        return out

    def _emit(self, out: Result, record: Record) -> None:
        out.records.append(record)
        self.replay(record)

    def _group_record(self, g: Group, now: int, assignments: dict[str, bytes] | None) -> Record:
        members = tuple(
            MemberValue(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.rebalance_timeout_ms,
                m.session_timeout_ms,
                m.metadata(g.protocol),
                (assignments or {}).get(m.member_id, b""),
            )
            for m in g.members.values()
        )
        return GroupKey(g.group_id), GroupValue(
            g.protocol_type or "", g.generation, g.protocol, g.leader, now, members
        )

    # ---- membership helpers -------------------------------------------------------------------
    def _drop_member(self, g: Group, member_id: str) -> Member | None:
        m = g.members.pop(member_id, None)
        if m is not None and m.group_instance_id and g.static.get(m.group_instance_id) == member_id:
            del g.static[m.group_instance_id]
        return m

    def _remove_member(self, g: Group, member_id: str, now: int, out: Result, why: str) -> None:
        m = self._drop_member(g, member_id)
        if m is None:
            return
        out.note(f"group {g.group_id}: member {member_id} removed ({why})")
        if m.join_token is not None:
            out.answer(m.join_token, error_join(E.unknown_member_id, member_id))
        if m.sync_token is not None:
            out.answer(m.sync_token, error_sync(E.unknown_member_id))
        if g.state in (STABLE, COMPLETING):
            self._prepare_rebalance(g, now, out, f"member {member_id} removed")
        self._maybe_complete_join(g, now, out)

    def _prepare_rebalance(self, g: Group, now: int, out: Result, why: str) -> None:
        out.note(
            f"group {g.group_id}: preparing to rebalance in state {g.state} "
            f"with old generation {g.generation} ({why})"
        )
        if g.state == COMPLETING:
            for m in g.members.values():
                if m.sync_token is not None:
                    out.answer(m.sync_token, error_sync(E.rebalance_in_progress))
                    m.sync_token = None
        delay = self.config.initial_rebalance_delay_ms
        g.initial_delay_until = now + delay if g.state == EMPTY and delay > 0 else 0
        timeout = max((m.rebalance_timeout_ms for m in g.members.values()), default=0)
        g.rebalance_deadline = now + max(timeout, delay if g.initial_delay_until else 0)
        g.state = PREPARING

    def _all_joined(self, g: Group) -> bool:
        return not g.pending and all(m.join_token is not None for m in g.members.values())

    def _maybe_complete_join(self, g: Group, now: int, out: Result) -> None:
        if g.state != PREPARING or not self._all_joined(g):
            return
        if g.initial_delay_until and now < g.initial_delay_until:
            return
        self._complete_join(g, now, out)

    def _select_protocol(self, g: Group) -> str | None:
        members = list(g.members.values())
        common = set(n for n, _ in members[0].protocols)
        for m in members[1:]:
            common &= {n for n, _ in m.protocols}
        votes: dict[str, int] = {}
        for m in members:
            choice = next((n for n, _ in m.protocols if n in common), None)
            if choice is not None:
                votes[choice] = votes.get(choice, 0) + 1
        return max(votes, key=lambda n: votes[n]) if votes else None

    def _complete_join(self, g: Group, now: int, out: Result) -> None:
        for mid in [mid for mid, m in g.members.items() if m.join_token is None]:
            self._drop_member(g, mid)
            out.note(f"group {g.group_id}: member {mid} removed (it did not rejoin in time)")
        g.pending.clear()
        g.initial_delay_until = 0
        g.generation += 1
        if not g.members:
            g.protocol, g.leader = None, None
            self._emit(out, self._group_record(g, now, None))
            return
        g.protocol = self._select_protocol(g)
        if g.leader not in g.members:
            g.leader = next(iter(g.members))
        g.state = COMPLETING
        g.rebalance_deadline = now + max(m.rebalance_timeout_ms for m in g.members.values())
        out.note(
            f"group {g.group_id}: generation {g.generation} ({g.protocol}) with "
            f"{len(g.members)} member(s), leader {g.leader}; awaiting the leader's assignment"
        )
        for m in g.members.values():
            out.answer(m.join_token, self._join_response(g, m))
            m.join_token = None
            m.heartbeat_deadline = now + m.session_timeout_ms

    def _join_response(self, g: Group, m: Member, skip: bool = False) -> dict[str, Any]:
        leader = m.member_id == g.leader
        return {
            "error_code": E.none,
            "generation_id": g.generation,
            "protocol_type": g.protocol_type,
            "protocol_name": g.protocol,
            "leader": g.leader or "",
            "skip_assignment": skip and leader,
            "member_id": m.member_id,
            "members": [
                {
                    "member_id": o.member_id,
                    "group_instance_id": o.group_instance_id,
                    "metadata": o.metadata(g.protocol),
                }
                for o in g.members.values()
            ]
            if leader
            else [],
        }

    def _member(
        self, g: Group | None, member_id: str, instance_id: str | None
    ) -> tuple[Member | None, E]:
        """The member a request names, or the error Kafka gives (fencing first)."""
        if g is None or g.state == DEAD:
            return None, E.unknown_member_id
        if instance_id:
            known = g.static.get(instance_id)
            if known is not None and known != member_id:
                return None, E.fenced_instance_id
        m = g.members.get(member_id)
        return (m, E.none) if m is not None else (None, E.unknown_member_id)

    # ---- JoinGroup ----------------------------------------------------------------------------
    def join(self, req: JoinRequest, token: Any, now: int) -> Result:
        out = Result()
        cfg = self.config
        if not req.group_id:
            return out.answer(token, error_join(E.invalid_group_id, req.member_id))
        if not cfg.min_session_timeout_ms <= req.session_timeout_ms <= cfg.max_session_timeout_ms:
            return out.answer(token, error_join(E.invalid_session_timeout, req.member_id))
        g = self.groups.get(req.group_id)
        if g is not None and g.state == DEAD:
            return out.answer(token, error_join(E.coordinator_not_available, req.member_id))
        if not req.protocol_type or not req.protocols:
            return out.answer(token, error_join(E.inconsistent_group_protocol, req.member_id))
        if g is not None and g.members:
            names = {n for n, _ in req.protocols}
            if g.protocol_type != req.protocol_type or not all(
                names & {n for n, _ in m.protocols} for m in g.members.values()
            ):
                return out.answer(token, error_join(E.inconsistent_group_protocol, req.member_id))
        if g is None:
            g = self.groups[req.group_id] = Group(req.group_id)
        if not req.member_id:
            return self._join_new(g, req, token, now, out)
        return self._join_known(g, req, token, now, out)

    def _new_member(self, g: Group, req: JoinRequest, member_id: str) -> Member:
        m = Member(
            member_id,
            req.group_instance_id,
            req.client_id,
            req.client_host,
            req.rebalance_timeout_ms,
            req.session_timeout_ms,
            req.protocol_type,
            req.protocols,
        )
        g.members[member_id] = m
        if req.group_instance_id:
            g.static[req.group_instance_id] = member_id
        if not g.protocol_type:
            g.protocol_type = req.protocol_type
        return m

    def _join_new(self, g: Group, req: JoinRequest, token: Any, now: int, out: Result) -> Result:
        member_id = f"{req.group_instance_id or req.client_id}-{self._new_id()}"
        old_id = g.static.get(req.group_instance_id) if req.group_instance_id else None
        if old_id is not None:
            return self._replace_static(g, old_id, member_id, req, token, now, out)
        if len(g.members) + len(g.pending) >= self.config.max_size:
            return out.answer(token, error_join(E.group_max_size_reached))
        if req.require_known_member_id and not req.group_instance_id:
            g.pending[member_id] = now + req.session_timeout_ms
            return out.answer(token, error_join(E.member_id_required, member_id))
        m = self._new_member(g, req, member_id)
        return self._joined(g, m, token, now, out)

    def _replace_static(
        self,
        g: Group,
        old_id: str,
        new_id: str,
        req: JoinRequest,
        token: Any,
        now: int,
        out: Result,
    ) -> Result:
        """A static member came back with a new member id: it takes the old one's place."""
        old = self._drop_member(g, old_id)
        assert old is not None
        if old.join_token is not None:
            out.answer(old.join_token, error_join(E.fenced_instance_id, old_id))
        if old.sync_token is not None:
            out.answer(old.sync_token, error_sync(E.fenced_instance_id))
        out.note(
            f"group {g.group_id}: static member {req.group_instance_id} "
            f"replaced {old_id} with {new_id}"
        )
        m = self._new_member(g, req, new_id)
        m.assignment = old.assignment
        if g.leader == old_id:
            g.leader = new_id
        unchanged = old.metadata(g.protocol) == m.metadata(g.protocol) and g.protocol in {
            n for n, _ in req.protocols
        }
        if g.state == STABLE and unchanged:
            m.heartbeat_deadline = now + m.session_timeout_ms
            self._emit(
                out, self._group_record(g, now, {k: v.assignment for k, v in g.members.items()})
            )
            return out.answer(token, self._join_response(g, m, skip=True))
        return self._joined(g, m, token, now, out)

    def _joined(self, g: Group, m: Member, token: Any, now: int, out: Result) -> Result:
        """``m`` (re)joins with ``token``: start or continue a rebalance."""
        m.join_token = token
        if g.state in (EMPTY, STABLE, COMPLETING):
            self._prepare_rebalance(g, now, out, f"member {m.member_id} joined")
        self._maybe_complete_join(g, now, out)
        return out

    def _join_known(self, g: Group, req: JoinRequest, token: Any, now: int, out: Result) -> Result:
        if req.member_id in g.pending:
            del g.pending[req.member_id]
            added = self._new_member(g, req, req.member_id)
            return self._joined(g, added, token, now, out)
        found, err = self._member(g, req.member_id, req.group_instance_id)
        if found is None:
            return out.answer(token, error_join(err, req.member_id))
        m = found
        changed = m.protocols != req.protocols
        m.protocols = req.protocols
        m.session_timeout_ms, m.rebalance_timeout_ms = (
            req.session_timeout_ms,
            req.rebalance_timeout_ms,
        )
        m.heartbeat_deadline = now + m.session_timeout_ms
        if g.state == PREPARING:
            if m.join_token is not None:  # a retried join replaces the earlier one
                out.answer(m.join_token, error_join(E.unknown_member_id, m.member_id))
            m.join_token = token
            self._maybe_complete_join(g, now, out)
            return out
        if g.state == COMPLETING and not changed:
            return out.answer(token, self._join_response(g, m))
        if g.state == STABLE and not changed and m.member_id != g.leader:
            return out.answer(token, self._join_response(g, m))
        return self._joined(g, m, token, now, out)

    # ---- SyncGroup ----------------------------------------------------------------------------
    def sync(self, req: SyncRequest, token: Any, now: int) -> Result:
        out = Result()
        g = self.groups.get(req.group_id)
        m, err = self._member(g, req.member_id, req.group_instance_id)
        if m is None or g is None:
            return out.answer(token, error_sync(err))
        if req.generation_id != g.generation:
            return out.answer(token, error_sync(E.illegal_generation))
        if (req.protocol_type and req.protocol_type != g.protocol_type) or (
            req.protocol_name and req.protocol_name != g.protocol
        ):
            return out.answer(token, error_sync(E.inconsistent_group_protocol))
        m.heartbeat_deadline = now + m.session_timeout_ms
        if g.state == EMPTY:
            return out.answer(token, error_sync(E.unknown_member_id))
        if g.state == PREPARING:
            return out.answer(token, error_sync(E.rebalance_in_progress))
        if g.state == STABLE:
            return out.answer(token, self._sync_response(g, m.assignment))
        if m.sync_token is not None:
            out.answer(m.sync_token, error_sync(E.rebalance_in_progress))
        m.sync_token = token
        if m.member_id != g.leader:
            return out
        given = dict(req.assignments)
        assignments = {mid: given.get(mid, b"") for mid in g.members}
        waiting = [(o.sync_token, assignments[o.member_id]) for o in g.members.values()]
        for o in g.members.values():
            o.sync_token = None
        self._emit(out, self._group_record(g, now, assignments))
        out.note(f"group {g.group_id}: stable in generation {g.generation}")
        for t, a in waiting:
            if t is not None:
                out.answer(t, self._sync_response(g, a))
        return out

    @staticmethod
    def _sync_response(g: Group, assignment: bytes) -> dict[str, Any]:
        return {
            "error_code": E.none,
            "protocol_type": g.protocol_type,
            "protocol_name": g.protocol,
            "assignment": assignment,
        }

    # ---- Heartbeat / LeaveGroup ---------------------------------------------------------------
    def heartbeat(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None, now: int
    ) -> E:
        g = self.groups.get(group_id)
        m, err = self._member(g, member_id, instance_id)
        if m is None or g is None:
            return err
        if g.state == EMPTY:
            return E.unknown_member_id
        if generation != g.generation:
            return E.illegal_generation
        m.heartbeat_deadline = now + m.session_timeout_ms
        return E.rebalance_in_progress if g.state == PREPARING else E.none

    def leave(
        self, group_id: str, members: list[tuple[str, str | None]], now: int
    ) -> tuple[Result, E, list[E]]:
        """Remove members: (result, top-level error, error per member)."""
        out = Result()
        g = self.groups.get(group_id)
        if g is None or g.state == DEAD:
            return out, E.unknown_member_id, [E.unknown_member_id] * len(members)
        errors = []
        for member_id, instance_id in members:
            if instance_id:
                known = g.static.get(instance_id)
                if known is None:
                    errors.append(E.unknown_member_id)
                    continue
                if member_id and member_id != known:
                    errors.append(E.fenced_instance_id)
                    continue
                member_id = known
            if member_id in g.pending:
                del g.pending[member_id]
                errors.append(E.none)
                self._maybe_complete_join(g, now, out)
                continue
            if member_id not in g.members:
                errors.append(E.unknown_member_id)
                continue
            errors.append(E.none)
            self._remove_member(g, member_id, now, out, "it left the group")
        return out, E.none, errors

    # ---- timers -------------------------------------------------------------------------------
    def tick(self, now: int) -> Result:
        """Expire sessions, end rebalance timeouts and initial delays due by ``now``."""
        out = Result()
        for g in list(self.groups.values()):
            for mid, deadline in list(g.pending.items()):
                if deadline <= now:
                    del g.pending[mid]
                    self._maybe_complete_join(g, now, out)
            for m in list(g.members.values()):
                if m.join_token is None and m.heartbeat_deadline and m.heartbeat_deadline <= now:
                    self._remove_member(g, m.member_id, now, out, "session timeout")
            if g.state == PREPARING:
                if g.rebalance_deadline <= now:
                    self._complete_join(g, now, out)
                else:
                    self._maybe_complete_join(g, now, out)
        return out

    def next_deadline(self) -> int | None:
        """The earliest time :meth:`tick` has something to do (None: nothing scheduled)."""
        times: list[int] = []
        for g in self.groups.values():
            times += g.pending.values()
            times += [m.heartbeat_deadline for m in g.members.values() if m.heartbeat_deadline]
            if g.state == PREPARING:
                times.append(g.rebalance_deadline)
                if g.initial_delay_until:
                    times.append(g.initial_delay_until)
        return min(times, default=None)

    # ---- offsets -------------------------------------------------------------------------------
    def commit(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        instance_id: str | None,
        partitions: list[CommitPartition],
        now: int,
    ) -> tuple[Result, E | None, list[E]]:
        """Commit offsets: (result, error for every partition or None, error per partition)."""
        out = Result()
        g = self.groups.get(group_id)
        if not group_id:
            return out, E.invalid_group_id, []
        if g is None or g.state == DEAD:
            if generation >= 0 or member_id:
                return out, E.illegal_generation, []
        elif generation < 0 and not member_id and g.state == EMPTY:
            pass  # a simple (admin / assign-mode) commit
        else:
            m, err = self._member(g, member_id, instance_id)
            if err == E.fenced_instance_id:
                return out, err, []
            if g.state == COMPLETING:
                return out, E.rebalance_in_progress, []
            if m is None:
                return out, E.unknown_member_id, []
            if generation != g.generation:
                return out, E.illegal_generation, []
            m.heartbeat_deadline = now + m.session_timeout_ms
        errors = []
        for p in partitions:
            meta = p.metadata or ""
            if len(meta.encode()) > self.config.offset_metadata_max_bytes:
                errors.append(E.offset_metadata_too_large)
                continue
            errors.append(E.none)
            self._emit(
                out,
                (
                    OffsetKey(group_id, p.topic, p.partition),
                    OffsetValue(p.offset, p.leader_epoch, meta, now),
                ),
            )
        return out, None, errors

    def txn_commit(
        self,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: list[CommitPartition],
        now: int,
    ) -> tuple[Result, list[E]]:
        """TxnOffsetCommit: the offset records, to append as a transactional batch of the
        producer (as Kafka does), and held as pending until the transaction's marker
        (:meth:`replay_marker`); (result, error per partition)."""
        out = Result(producer=(producer_id, producer_epoch))
        errors = []
        for p in partitions:
            meta = p.metadata or ""
            if len(meta.encode()) > self.config.offset_metadata_max_bytes:
                errors.append(E.offset_metadata_too_large)
                continue
            record = (
                OffsetKey(group_id, p.topic, p.partition),
                OffsetValue(p.offset, p.leader_epoch, meta, now),
            )
            out.records.append(record)
            self.replay_txn(producer_id, record)
            errors.append(E.none)
        return out, errors

    def replay_txn(self, producer_id: int, record: Record) -> None:
        """An offset record of ``producer_id``'s open transaction: pending until its marker."""
        key, value = record
        if isinstance(key, OffsetKey) and isinstance(value, OffsetValue):
            pending = self.pending_txn.setdefault(producer_id, {})
            pending[(key.group, key.topic, key.partition)] = value

    def replay_marker(self, producer_id: int, commit: bool) -> None:
        """A transaction marker of ``producer_id``: its pending offsets become the group's
        committed offsets (commit) or are dropped (abort)."""
        offsets = self.pending_txn.pop(producer_id, {})
        if commit:
            for (group, topic, partition), value in sorted(offsets.items()):
                self.replay((OffsetKey(group, topic, partition), value))

    def unstable_offsets(self, group_id: str) -> set[tuple[str, int]]:
        """(topic, partition) of ``group_id`` with a transactional commit awaiting its marker."""
        return {
            (t, p) for pending in self.pending_txn.values() for g, t, p in pending if g == group_id
        }

    def complete_txn(self, producer_id: int, commit: bool, now: int) -> Result:
        """The transaction of ``producer_id`` ended and its marker is replicated in this
        partition: its offsets are committed, or dropped (nothing to write: a reload replays
        the marker)."""
        self.replay_marker(producer_id, commit)
        return Result()

    def fetch_offsets(
        self, group_id: str, topics: list[tuple[str, list[int]]] | None
    ) -> list[tuple[str, list[tuple[int, OffsetValue | None]]]]:
        """Committed offsets per topic; ``topics`` None = everything the group committed."""
        g = self.groups.get(group_id)
        offsets = g.offsets if g is not None else {}
        if topics is None:
            by_topic: dict[str, list[tuple[int, OffsetValue | None]]] = {}
            for (t, p), v in sorted(offsets.items()):
                by_topic.setdefault(t, []).append((p, v))
            return list(by_topic.items())
        return [(t, [(p, offsets.get((t, p))) for p in parts]) for t, parts in topics]

    # ---- admin ----------------------------------------------------------------------------------
    def list_groups(self, states: set[str], types: set[str]) -> list[dict[str, Any]]:
        out = []
        for g in self.groups.values():
            if states and g.state.lower() not in states:
                continue
            if types and "classic" not in types:
                continue
            out.append(
                {
                    "group_id": g.group_id,
                    "protocol_type": g.protocol_type or "",
                    "group_state": g.state,
                    "group_type": "classic",
                }
            )
        return out

    def describe(self, group_id: str) -> dict[str, Any] | None:
        g = self.groups.get(group_id)
        if g is None:
            return None
        stable = g.state == STABLE
        return {
            "error_code": E.none,
            "error_message": None,
            "group_id": g.group_id,
            "group_state": g.state,
            "protocol_type": g.protocol_type or "",
            "protocol_data": (g.protocol or "") if stable else "",
            "members": [
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "member_metadata": m.metadata(g.protocol) if stable else b"",
                    "member_assignment": m.assignment if stable else b"",
                }
                for m in g.members.values()
            ],
            "authorized_operations": -2147483648,
        }

    def delete_group(self, group_id: str, now: int) -> tuple[Result, E]:
        out = Result()
        g = self.groups.get(group_id)
        if g is None or g.state == DEAD:
            return out, E.group_id_not_found
        if g.state != EMPTY:
            return out, E.non_empty_group
        for t, p in sorted(g.offsets):
            self._emit(out, (OffsetKey(group_id, t, p), None))
        self._emit(out, (GroupKey(group_id), None))
        return out, E.none

    def delete_offsets(
        self, group_id: str, topics: list[tuple[str, list[int]]], now: int
    ) -> tuple[Result, E, list[tuple[str, list[tuple[int, E]]]]]:
        out = Result()
        g = self.groups.get(group_id)
        if g is None or g.state == DEAD:
            return out, E.group_id_not_found, []
        subscribed: set[str] = set()
        if g.state != EMPTY:
            if g.protocol_type != "consumer":
                return out, E.non_empty_group, []
            for m in g.members.values():
                subscribed |= subscribed_topics(m.metadata(g.protocol))
        results = []
        for t, parts in topics:
            row = []
            for p in parts:
                if t in subscribed:
                    row.append((p, E.group_subscribed_to_topic))
                    continue
                if (t, p) in g.offsets:
                    self._emit(out, (OffsetKey(group_id, t, p), None))
                row.append((p, E.none))
            results.append((t, row))
        return out, E.none, results

    def expire_offsets(self, now: int) -> Result:
        """Tombstones for offsets of groups Empty (and offsets committed) longer than
        ``offsets.retention.minutes``, then for the groups left with no offsets (KIP-211)."""
        out = Result()
        horizon = now - self.config.offsets_retention_ms
        for g in list(self.groups.values()):
            if g.state != EMPTY:
                continue
            for (t, p), v in sorted(g.offsets.items()):
                # KIP-211: a group's offsets expire once it has been Empty that long
                if max(v.commit_timestamp, g.state_timestamp) < horizon:
                    self._emit(out, (OffsetKey(g.group_id, t, p), None))
            if not g.offsets and g.state_timestamp < horizon and not g.pending:
                self._emit(out, (GroupKey(g.group_id), None))
        return out
