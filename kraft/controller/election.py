"""Leader election rules: the partition change for a target ISR / replica set (docs/kraft-notes.md,
Leader election), as Kafka's PartitionChangeBuilder does with eligible leader replicas (ELR) disabled.

Everything here is pure: functions take a :class:`PartitionRegistration` (or an image) and an
``is_acceptable(broker_id)`` predicate and return the :class:`PartitionChangeRecord` to write, or
None when nothing would change.

Election kinds:

* ``online`` (every change): keep the current leader if it stays in the ISR and is acceptable,
  else the first replica (replica order) in the ISR that is acceptable, else no leader.
* ``preferred``: replica 0 if it is in the ISR and acceptable; else keep the current leader if it
  still qualifies; else the first other ISR replica that qualifies; else no leader.
* ``unclean``: as online, but when no ISR member qualifies take the first acceptable replica; the
  ISR becomes just that leader and the leader recovery state RECOVERING (data may be lost).

With ELR disabled the ISR is never emptied: a target ISR that would be empty leaves the ISR as it
is (its last member stays, so it can lead cleanly when it returns).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import itemgetter
from typing import NamedTuple

from kraft.errors import ErrorCode
from kraft.metadata.image import MetadataImage, TopicImage
from kraft.metadata.partition_map import partition_chunks
from kraft.metadata.registrations import PartitionRegistration
from kraft.records import (
    LEADER_NONE,
    LEADER_UNCHANGED,
    RECOVERING,
    RECOVERY_UNCHANGED,
    PartitionChangeRecord,
)

__all__ = [
    "ONLINE",
    "PREFERRED",
    "UNCLEAN",
    "Changes",
    "ElectionOutcome",
    "build_partition_change",
    "changes_for_controlled_shutdown",
    "changes_for_fenced_broker",
    "changes_for_offline_replicas",
    "changes_for_unfenced_broker",
    "complete_reassignment",
    "elect_preferred_leader",
    "elect_unclean_leader",
    "leaving_change",
    "leaving_changes",
    "needs_offline_change",
    "returning_changes",
    "returning_start",
]

ONLINE, PREFERRED, UNCLEAN = "online", "preferred", "unclean"
_ELECTIONS = (ONLINE, PREFERRED, UNCLEAN)

IsAcceptable = Callable[[int], bool]
UncleanAllowed = Callable[[TopicImage], bool]


class ElectionOutcome(NamedTuple):
    """An election's record (None: nothing to write) and its error (``ErrorCode.NONE`` on success)."""

    record: PartitionChangeRecord | None
    error: ErrorCode


_first = itemgetter(0)


def _never(_: TopicImage) -> bool:
    return False


# ---------------------------------------------------------------------------------------------
# The builder
# ---------------------------------------------------------------------------------------------


def complete_reassignment(
    replicas: Sequence[int], isr: Sequence[int], removing: Sequence[int], adding: Sequence[int]
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """If a reassignment is in progress and ``isr`` now allows finishing it, the final
    (replicas, isr): the removing replicas are dropped from both, which must leave a non-empty ISR
    that holds every remaining replica. None if there is nothing to finish yet."""
    if not removing and not adding:
        return None
    new_isr, new_replicas = tuple(isr), tuple(replicas)
    if removing:
        new_isr = tuple(b for b in isr if b not in removing)
        if not new_isr:
            return None
        new_replicas = tuple(b for b in replicas if b not in removing)
    if any(b not in new_isr for b in new_replicas):
        return None
    return new_replicas, new_isr


def _elect(
    partition: PartitionRegistration,
    replicas: Sequence[int],
    isr: Sequence[int],
    is_acceptable: IsAcceptable,
    election: str,
) -> tuple[int, str | None]:
    """(leader, how) for the target replicas/ISR; how is "clean", "preferred", "unclean" or None
    when the result is the current leader or no leader."""

    def qualifies(b: int) -> bool:
        return b != LEADER_NONE and b in isr and is_acceptable(b)

    current = partition.leader
    if election == PREFERRED:
        if replicas and qualifies(replicas[0]):
            return replicas[0], "preferred"
        if qualifies(current):
            return current, None
        for b in replicas[1:]:
            if qualifies(b):
                return b, "clean"
        return LEADER_NONE, None
    if qualifies(current):
        return current, None
    for b in replicas:
        if qualifies(b):
            return b, "clean"
    if election == UNCLEAN:
        for b in replicas:
            if is_acceptable(b):
                return b, "unclean"
    return LEADER_NONE, None


def build_partition_change(
    topic_id: str,
    partition_id: int,
    partition: PartitionRegistration,
    is_acceptable: IsAcceptable,
    *,
    target_isr: Sequence[int] | None = None,
    target_replicas: Sequence[int] | None = None,
    target_removing: Sequence[int] | None = None,
    target_adding: Sequence[int] | None = None,
    target_recovery_state: int = RECOVERY_UNCHANGED,
    election: str = ONLINE,
    unclean_allowed: bool = False,
) -> PartitionChangeRecord | None:
    """The PartitionChangeRecord that moves ``partition`` to the targets (None = keep) and elects
    a leader by ``election``; None when nothing would change.

    ``unclean_allowed`` (the topic's ``unclean.leader.election.enable``) turns an online election
    into an unclean one. A change that drops a replica from the replica set also sets the leader
    (to the same broker if it stays) so that the leader epoch moves and fetchers re-sync."""
    if election not in _ELECTIONS:
        raise ValueError(f"unknown election type {election!r}")
    if election == ONLINE and unclean_allowed:
        election = UNCLEAN
    replicas = partition.replicas if target_replicas is None else tuple(target_replicas)
    isr = partition.isr if target_isr is None else tuple(target_isr)
    removing = partition.removing_replicas if target_removing is None else tuple(target_removing)
    adding = partition.adding_replicas if target_adding is None else tuple(target_adding)
    recovery = (
        partition.leader_recovery_state
        if target_recovery_state == RECOVERY_UNCHANGED
        else target_recovery_state
    )

    if removing or adding:
        finished = complete_reassignment(replicas, isr, removing, adding)
        if finished is not None:
            replicas, isr = finished
            removing, adding = (), ()

    leader, how = _elect(partition, replicas, isr, is_acceptable, election)
    leader_field = LEADER_UNCHANGED
    if leader != partition.leader:
        leader_field = leader
        if how == "unclean":
            isr = (leader,)
            recovery = RECOVERING
    elif replicas is not partition.replicas and any(b not in replicas for b in partition.replicas):
        leader_field, how = leader, "clean"  # a replica left: set the leader to bump its epoch

    # ELR disabled: an ISR is never emptied (the last member stays)
    isr_field = isr if isr and isr != partition.isr else None
    replicas_field = replicas if replicas != partition.replicas else None
    removing_field = removing if removing != partition.removing_replicas else None
    adding_field = adding if adding != partition.adding_replicas else None
    recovery_field = recovery if recovery != partition.leader_recovery_state else RECOVERY_UNCHANGED

    if (
        leader_field == LEADER_UNCHANGED
        and isr_field is None
        and replicas_field is None
        and removing_field is None
        and adding_field is None
        and recovery_field == RECOVERY_UNCHANGED
    ):
        return None
    if leader_field in (LEADER_UNCHANGED, LEADER_NONE):
        how = None
    return PartitionChangeRecord(
        partition_id,
        topic_id,
        isr_field,
        leader_field,
        replicas_field,
        removing_field,
        adding_field,
        recovery_field,
        how,
    )


# ---------------------------------------------------------------------------------------------
# Requested elections
# ---------------------------------------------------------------------------------------------


def elect_preferred_leader(
    topic_id: str, partition_id: int, partition: PartitionRegistration, is_acceptable: IsAcceptable
) -> ElectionOutcome:
    """A requested preferred election: ELECTION_NOT_NEEDED when replica 0 already leads,
    PREFERRED_LEADER_NOT_AVAILABLE when nothing would change (replica 0 not in the ISR or not
    acceptable and the current leader stays)."""
    if partition.replicas and partition.leader == partition.replicas[0]:
        return ElectionOutcome(None, ErrorCode.ELECTION_NOT_NEEDED)
    record = build_partition_change(
        topic_id, partition_id, partition, is_acceptable, election=PREFERRED
    )
    if record is None:
        return ElectionOutcome(None, ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE)
    return ElectionOutcome(record, ErrorCode.NONE)


def elect_unclean_leader(
    topic_id: str, partition_id: int, partition: PartitionRegistration, is_acceptable: IsAcceptable
) -> ElectionOutcome:
    """A requested unclean election: ELECTION_NOT_NEEDED when the partition has a leader,
    ELIGIBLE_LEADERS_NOT_AVAILABLE when no replica is acceptable."""
    if partition.leader != LEADER_NONE:
        return ElectionOutcome(None, ErrorCode.ELECTION_NOT_NEEDED)
    record = build_partition_change(
        topic_id, partition_id, partition, is_acceptable, election=UNCLEAN
    )
    if record is None or record.leader in (LEADER_UNCHANGED, LEADER_NONE):
        return ElectionOutcome(None, ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE)
    return ElectionOutcome(record, ErrorCode.NONE)


# ---------------------------------------------------------------------------------------------
# Broker transitions (deterministic order: topics by name, partitions by id)
# ---------------------------------------------------------------------------------------------


def _topics_in_name_order(image: MetadataImage) -> Iterator[TopicImage]:
    by_id, by_name = image.topics_by_id, image.topics_by_name
    for name in image.topic_names():
        yield by_id[by_name[name]]


def _active_brokers_except(
    image: MetadataImage, broker_id: int, also: frozenset[int] = frozenset()
) -> frozenset[int]:
    return frozenset(
        b
        for b, reg in image.brokers.items()
        if b != broker_id and b not in also and not reg.fenced and not reg.in_controlled_shutdown
    )


class Changes(list[PartitionChangeRecord]):
    """Partition changes in deterministic order; ``remaining`` counts the affected partitions
    not examined because ``limit`` records were reached (a stepped transition continues there)."""

    remaining: int = 0


def _collect(
    candidates: Iterator[tuple[TopicImage, int, PartitionRegistration]],
    build: Callable[[TopicImage, int, PartitionRegistration], PartitionChangeRecord | None],
    limit: int | None,
) -> Changes:
    """Build records from ``candidates`` until ``limit`` of them exist; count the rest (a cheap
    scan instead of building records a later step would recompute anyway)."""
    out = Changes()
    for topic, pid, partition in candidates:
        if limit is not None and len(out) >= limit:
            out.remaining = 1 + sum(1 for _ in candidates)
            break
        record = build(topic, pid, partition)
        if record is not None:
            out.append(record)
    return out


Found = tuple[tuple[str, tuple[int, ...]], ...]
"""The topics the second pass of a leaving transition visits, by name, each with the ids of the
partitions it examines there (ascending)."""

Resume = tuple[int, str, int, Found]
"""Where a stepped transition continues: (pass: 0 = partitions the broker leads, 1 = those whose
ISR it is only in; topic name; partition id; the topics with pass-1 partitions found so far)."""

_LEADS, _IN_ISR = 0, 1


def leaving_changes(
    image: MetadataImage,
    broker_id: int,
    unclean_allowed: UncleanAllowed = _never,
    limit: int | None = None,
    resume: Resume | None = None,
    also: frozenset[int] = frozenset(),
    max_topics: int | None = None,
) -> tuple[Changes, Resume | None]:
    """The partition changes of ``broker_id`` leaving (fencing, controlled shutdown,
    unregistration), in two passes: first the partitions it leads (they have no usable leader
    until their record commits, so a big transition makes them available again first), then
    those whose ISR it is only in. Each pass goes by topic name, then partition id, from
    ``resume`` on (inclusive), until ``limit`` records exist. Returns the records and where the
    next step resumes — the next partition not examined — or None when both passes are done.
    The first pass notes, per topic, the partitions the second must examine (those it is only
    in the ISR of, and those it leads), so a whole transition scans the image once and every
    step costs O(its records), not O(image).

    Resuming is only an optimisation: partitions before ``resume`` were changed by earlier steps
    (or need no change) and yield nothing when examined again, and the first pass's changes take
    the broker out of those partitions' ISRs too, so a controller that scans from the start
    instead gets the same records, provided nothing else was written in between (the state
    machine only hands ``resume`` over then). For the same reason the second pass examines only
    the partitions noted: the first pass changes none but those it leads, which are noted too.

    ``also``: more brokers leaving at the same time (fenced together after their sessions
    expired at once); each partition then changes once for all of them. ``max_topics``: stop
    after examining that many topics and return where to go on (a search in slices, see
    :func:`leaving_start`)."""
    acceptable = _active_brokers_except(image, broker_id, also)
    gone = frozenset({broker_id}) | also
    out = Changes()
    by_id, by_name = image.topics_by_id, image.topics_by_name
    names = image.topic_names()
    phase, at_name, at_pid, in_isr = resume if resume is not None else (_LEADS, "", 0, ())
    found = list(in_isr)
    budget = max_topics if max_topics is not None else -1
    if phase == _LEADS:
        first = bisect_left(names, at_name) if resume is not None else 0
        for name in names[first:]:
            if budget == 0:
                return out, (_LEADS, name, 0, tuple(found))
            budget -= 1
            topic = by_id[by_name[name]]
            led: list[tuple[int, PartitionRegistration]] = []
            isr_only: list[int] = []
            allowed = unclean_allowed(topic)
            # p[1]: isr, p[2]/p[3]: removing/adding replicas, p[4]: leader. A partition they only
            # follow in changes unless they are its whole ISR (the last members stay) with no
            # reassignment and no unclean election: after the leaderships moved, such no-ops are
            # most of a whole cluster's partitions, and examining each made one step scan 2M
            # partitions for no record, past the election timeout.
            if also:
                for chunk in partition_chunks(topic.partitions):
                    for pid, p in chunk.items():
                        if p[4] in gone:
                            led.append((pid, p))
                        elif not gone.isdisjoint(p[1]) and (
                            allowed or p[2] or p[3] or not gone.issuperset(p[1])
                        ):
                            isr_only.append(pid)
            else:
                for chunk in partition_chunks(topic.partitions):
                    for pid, p in chunk.items():
                        if p[4] == broker_id:
                            led.append((pid, p))
                        elif broker_id in p[1] and (allowed or p[2] or p[3] or len(p[1]) > 1):
                            isr_only.append(pid)
            # a resumed topic was noted already
            if isr_only and not (found and found[-1][0] == name):
                found.append((name, tuple(sorted(isr_only + [pid for pid, _ in led]))))
            if not led:
                continue
            if resume is not None and name == at_name:
                led = [item for item in led if item[0] >= at_pid]
            led.sort(key=_first)
            step = _leaving_step(out, topic, led, gone, acceptable, unclean_allowed, limit)
            if step is not None:
                return out, (_LEADS, name, step, tuple(found))
        at_name, at_pid = "", 0
    todo = found[bisect_left(found, (at_name,)) :] if at_name else found
    for name, pids in todo:
        if budget == 0:
            return out, (_IN_ISR, name, 0, tuple(found))
        budget -= 1
        topic_id = by_name.get(name)
        if topic_id is None:
            continue
        topic = by_id[topic_id]
        allowed = unclean_allowed(topic)
        parts = topic.partitions
        if at_name and name == at_name:
            pids = tuple(pid for pid in pids if pid >= at_pid)
        affected = []
        for pid in pids:
            reg = parts.get(pid)
            if (
                reg is not None
                and reg[4] not in gone
                and not gone.isdisjoint(reg[1])
                and (allowed or reg[2] or reg[3] or not gone.issuperset(reg[1]))
            ):
                affected.append((pid, reg))
        step = _leaving_step(out, topic, affected, gone, acceptable, unclean_allowed, limit)
        if step is not None:
            return out, (_IN_ISR, name, step, tuple(found))
    return out, None


def leaving_start(
    image: MetadataImage,
    broker_id: int,
    unclean_allowed: UncleanAllowed = _never,
    resume: Resume | None = None,
    also: frozenset[int] = frozenset(),
    max_topics: int = 200,
) -> tuple[Resume, bool]:
    """One slice of the search for where a leaving transition's first change is: examine at
    most ``max_topics`` topics from ``resume`` on; returns (the resume point reached, whether
    the search is over). A caller repeats it, letting its event loop run between slices, and
    hands the final point to the first step, which then costs O(its records) instead of a scan
    of the whole image on the event loop (at 2M partitions, > 1 s: longer than the election
    timeout). Over: the point is the first partition to change, or the end (nothing left)."""
    start: Resume = resume if resume is not None else (_LEADS, "", 0, ())
    _, reached = leaving_changes(
        image, broker_id, unclean_allowed, limit=0, resume=start, also=also, max_topics=max_topics
    )
    if reached is None:
        return (_IN_ISR, "", 0, ()), True  # nothing to change: pass 2 over no topic
    return reached, reached == start


def _leaving_step(
    out: Changes,
    topic: TopicImage,
    affected: list[tuple[int, PartitionRegistration]],
    gone: frozenset[int],
    acceptable: frozenset[int],
    unclean_allowed: UncleanAllowed,
    limit: int | None,
) -> int | None:
    """Append the records of ``affected`` (one topic's partitions, by id) to ``out`` until it
    holds ``limit``; returns the first partition id left for the next step, or None."""
    topic_id = topic.topic_id
    allowed = unclean_allowed(topic)
    for pid, partition in affected:
        if limit is not None and len(out) >= limit:
            return pid
        record = leaving_change(topic_id, pid, partition, gone, acceptable, allowed)
        if record is not None:
            out.append(record)
    return None


def leaving_change(
    topic_id: str,
    partition_id: int,
    partition: PartitionRegistration,
    broker_id: int | frozenset[int],
    acceptable: frozenset[int],
    unclean_allowed: bool,
) -> PartitionChangeRecord | None:
    """The record of one partition when ``broker_id`` (or each of a set of them) leaves (None:
    nothing changes), given the ids of the brokers that may lead (``acceptable``, never
    negative): the same as ``build_partition_change(..., acceptable.__contains__,
    target_isr=<the ISR without the leaving brokers>, unclean_allowed=...)``, with that
    builder's rules spelt out for a partition without a reassignment in progress (the hot loop
    of fencing and controlled shutdown; a test holds the two equal)."""
    replicas, isr, removing, adding, leader, recovery = partition[:6]
    if isinstance(broker_id, frozenset):
        new_isr = tuple([b for b in isr if b not in broker_id])
    else:
        new_isr = tuple([b for b in isr if b != broker_id])
    if removing or adding:
        return build_partition_change(
            topic_id,
            partition_id,
            partition,
            acceptable.__contains__,
            target_isr=new_isr,
            unclean_allowed=unclean_allowed,
        )
    how: str | None = None
    if leader in new_isr and leader in acceptable:  # LEADER_NONE is never in the ISR
        new_leader = leader
    else:
        new_leader, how = LEADER_NONE, None
        for b in replicas:
            if b in new_isr and b in acceptable:
                new_leader, how = b, "clean"
                break
        else:
            if unclean_allowed:
                for b in replicas:
                    if b in acceptable:
                        new_leader, how = b, "unclean"
                        break
                if how is not None and new_leader != leader:
                    new_isr, recovery = (new_leader,), RECOVERING
    isr_field = new_isr if new_isr and new_isr != isr else None
    recovery_field = recovery if recovery != partition.leader_recovery_state else RECOVERY_UNCHANGED
    if new_leader == leader:
        if isr_field is None and recovery_field == RECOVERY_UNCHANGED:
            return None
        new_leader, how = LEADER_UNCHANGED, None
    elif new_leader == LEADER_NONE:
        how = None
    return PartitionChangeRecord(
        partition_id, topic_id, isr_field, new_leader, None, None, None, recovery_field, how
    )


def _changes_for_leaving_broker(
    image: MetadataImage, broker_id: int, unclean_allowed: UncleanAllowed, limit: int | None = None
) -> Changes:
    return leaving_changes(image, broker_id, unclean_allowed, limit)[0]


def changes_for_fenced_broker(
    image: MetadataImage,
    broker_id: int,
    unclean_allowed: UncleanAllowed = _never,
    limit: int | None = None,
) -> Changes:
    """Fencing ``broker_id`` (session timeout, want-fence, shutdown-now, unregistration): drop it
    from every ISR (the last member stays) and move leadership to another acceptable replica;
    the fenced broker is never acceptable. ``unclean_allowed(topic)`` is the topic's setting;
    at most ``limit`` records (see :class:`Changes`)."""
    return _changes_for_leaving_broker(image, broker_id, unclean_allowed, limit)


def changes_for_controlled_shutdown(
    image: MetadataImage,
    broker_id: int,
    unclean_allowed: UncleanAllowed = _never,
    limit: int | None = None,
) -> Changes:
    """A broker entering controlled shutdown leaves ISRs and leadership like a fenced one."""
    return _changes_for_leaving_broker(image, broker_id, unclean_allowed, limit)


def changes_for_unfenced_broker(
    image: MetadataImage,
    broker_id: int,
    unclean_allowed: UncleanAllowed = _never,
    limit: int | None = None,
    offline: frozenset[tuple[str, int]] = frozenset(),
) -> Changes:
    """Unfencing ``broker_id``: the records of :func:`returning_changes` from the first topic."""
    return returning_changes(image, broker_id, unclean_allowed, limit, offline=offline)[0]


def returning_changes(
    image: MetadataImage,
    broker_id: int,
    unclean_allowed: UncleanAllowed = _never,
    limit: int | None = None,
    resume: Resume | None = None,
    offline: frozenset[tuple[str, int]] = frozenset(),
    max_topics: int | None = None,
) -> tuple[Changes, Resume | None]:
    """Unfencing ``broker_id``: each leaderless partition it can lead gets a leader (cleanly when
    it is in the ISR, uncleanly where the topic allows it). The returning broker counts as
    acceptable even though the image still shows it fenced, except for its replicas in
    ``offline`` ((topic id, partition): on its offline log dirs), which it never leads.

    By topic name, then partition id, from ``resume`` on (inclusive), until ``limit`` records
    exist; returns them and where the next step resumes (the next partition to change), or None
    when none is left. Partitions before ``resume`` need no change (earlier steps gave them a
    leader), so a controller scanning from the start gets the same records provided nothing
    else was written in between; every step then costs O(the topics it passes), not O(image).
    ``max_topics``: stop after examining that many topics (a search in slices, see
    :func:`returning_start`). Only the first field of the pass in ``resume`` matters: ``_IN_ISR``
    means nothing is left."""
    out = Changes()
    phase, at_name, at_pid, _ = resume if resume is not None else (_LEADS, "", 0, ())
    if phase != _LEADS:
        return out, None
    acceptable = (_active_brokers_except(image, broker_id) | {broker_id}).__contains__
    by_id, by_name = image.topics_by_id, image.topics_by_name
    names = image.topic_names()
    budget = max_topics if max_topics is not None else -1
    for name in names[bisect_left(names, at_name) if at_name else 0 :]:
        if budget == 0:
            return out, (_LEADS, name, 0, ())
        budget -= 1
        topic = by_id[by_name[name]]
        pids = topic.leaderless()  # cached on the (shared, immutable) topic: O(1) mostly
        if not pids:
            continue
        allowed = unclean_allowed(topic)
        parts = topic.partitions
        # p[0]: replicas, p[1]: isr; without an unclean election it leads only where it is in
        # the ISR
        affected = [
            (pid, p)
            for pid in pids
            if broker_id in (p := parts[pid])[0] and (allowed or broker_id in p[1])
        ]
        if not affected:
            continue
        topic_id = topic.topic_id
        if offline:
            affected = [item for item in affected if (topic_id, item[0]) not in offline]
        if name == at_name:
            affected = [item for item in affected if item[0] >= at_pid]
        for pid, partition in affected:
            if limit is not None and len(out) >= limit:
                return out, (_LEADS, name, pid, ())
            record = build_partition_change(
                topic_id, pid, partition, acceptable, unclean_allowed=allowed
            )
            if record is not None:
                out.append(record)
    return out, None


def returning_start(
    image: MetadataImage,
    broker_id: int,
    unclean_allowed: UncleanAllowed = _never,
    resume: Resume | None = None,
    offline: frozenset[tuple[str, int]] = frozenset(),
    max_topics: int = 200,
) -> tuple[Resume, bool]:
    """One slice of the search for an unfence's first change (see :func:`leaving_start`):
    returns (the point reached, whether the search is over); over, the point is the first
    partition to change, or one that says nothing is left."""
    start: Resume = resume if resume is not None else (_LEADS, "", 0, ())
    _, reached = returning_changes(
        image, broker_id, unclean_allowed, 0, start, offline, max_topics=max_topics
    )
    if reached is None:
        return (_IN_ISR, "", 0, ()), True
    return reached, reached == start


def leaderless_isr_brokers(topics: Iterable[TopicImage], active: frozenset[int]) -> set[int]:
    """The brokers of ``active`` in the ISR of a leaderless partition of ``topics``: each could
    lead it now. Normally none: unfencing a broker elects it wherever it can lead. An unfence
    interrupted between its steps (a failover) leaves some, and whoever resumes it needs them."""
    found: set[int] = set()
    for topic in topics:
        parts = topic.partitions
        for pid in topic.leaderless():
            found.update(b for b in parts[pid].isr if b in active)
    return found


def needs_offline_change(partition: PartitionRegistration, broker_id: int) -> bool:
    """Whether ``broker_id``'s offline replica of ``partition`` still leads it or sits in its
    ISR beside others (the last ISR member stays: the ISR is never emptied)."""
    return partition.leader == broker_id or (broker_id in partition.isr and len(partition.isr) > 1)


def changes_for_offline_replicas(
    image: MetadataImage,
    broker_id: int,
    replicas: Sequence[tuple[str, int]],
    unclean_allowed: UncleanAllowed = _never,
    limit: int | None = None,
) -> Changes:
    """Replicas of ``broker_id`` whose log dir went offline (KIP-858): each leaves the ISR and
    leadership as if its broker were fenced, but only for that partition; the broker itself
    stays acceptable elsewhere. ``replicas``: (topic id, partition) pairs; unknown ones, and
    ones already moved off, yield nothing. Sorted by topic name then partition."""
    acceptable = _active_brokers_except(image, broker_id).__contains__
    found: list[tuple[str, int, TopicImage, PartitionRegistration]] = []
    for topic_id, pid in set(replicas):
        topic = image.topics_by_id.get(topic_id)
        partition = topic.partitions.get(pid) if topic is not None else None
        if (
            topic is not None
            and partition is not None
            and needs_offline_change(partition, broker_id)
        ):
            found.append((topic.name, pid, topic, partition))
    found.sort(key=lambda item: (item[0], item[1]))
    allowed: dict[str, bool] = {}

    def build(
        topic: TopicImage, pid: int, partition: PartitionRegistration
    ) -> PartitionChangeRecord | None:
        if topic.topic_id not in allowed:
            allowed[topic.topic_id] = unclean_allowed(topic)
        return build_partition_change(
            topic.topic_id,
            pid,
            partition,
            acceptable,
            target_isr=[b for b in partition.isr if b != broker_id],
            unclean_allowed=allowed[topic.topic_id],
        )

    return _collect(((t, pid, p) for _, pid, t, p in found), build, limit)
