"""Topics and partitions (Kafka's ReplicationControlManager): create topics and partitions,
delete topics, elect leaders, AlterPartition, and the partition changes a broker's fencing,
controlled shutdown, unregistration or unfencing causes.

Every handler is a pure function ``(image, command, settings) -> ControllerResult``: it validates
against the image and returns records plus a response; nothing here mutates state. Results of
user requests are atomic: if they would need more than ``settings.max_records_per_batch``
records, the request fails with POLICY_VIOLATION. Broker transitions (fence, unfence, controlled
shutdown, unregister) are never refused for size: cluster_control moves one batch worth per
command. ElectLeaders over *all* partitions stops at the limit; the caller repeats it.
Election rules come from kraft.controller.election, placement from kraft.controller.placement.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeGuard

from kraft.controller.commands import Command, ControllerResult, derive_rng, error_fields
from kraft.controller.configs import is_true, validate_value
from kraft.controller.election import (
    Changes,
    Resume,
    build_partition_change,
    changes_for_offline_replicas,
    elect_preferred_leader,
    elect_unclean_leader,
    leaving_changes,
    returning_changes,
)
from kraft.controller.placement import place_replicas
from kraft.controller.settings import ControllerSettings
from kraft.controller.topic_names import collision_error, find_collision, validate_topic_name
from kraft.errors import ErrorCode, KraftError
from kraft.metadata.image import MetadataImage, TopicImage
from kraft.metadata.registrations import PartitionRegistration
from kraft.records import (
    LEADER_NONE,
    RECOVERED,
    RECOVERING,
    RESOURCE_BROKER,
    RESOURCE_TOPIC,
    ConfigRecord,
    PartitionChangeRecord,
    PartitionRecord,
    Record,
    RemoveTopicRecord,
    TopicRecord,
)


def _fail(code: ErrorCode, message: str) -> KraftError:
    return KraftError(code, message)


def _is_int(v: Any) -> TypeGuard[int]:
    return type(v) is int


# ---------------------------------------------------------------------------------------------
# Elections: the partition change for a target ISR (Kafka's PartitionChangeBuilder, ELR off)
# ---------------------------------------------------------------------------------------------


def unclean_allowed(image: MetadataImage, settings: ControllerSettings, topic_name: str) -> bool:
    """``unclean.leader.election.enable`` for a topic: its own config, else the cluster-wide
    dynamic broker default, else the controller setting."""
    value = image.config(RESOURCE_TOPIC, topic_name).get("unclean.leader.election.enable")
    if value is None:
        value = image.config(RESOURCE_BROKER, "").get("unclean.leader.election.enable")
    if value is None:
        return settings.unclean_leader_election_enable
    return is_true(value)


def _topics_by_name(image: MetadataImage) -> Iterator[TopicImage]:
    by_id = image.topics_by_id
    for name in image.topic_names():
        yield by_id[image.topics_by_name[name]]


def _sorted_partitions(topic: TopicImage) -> Iterator[tuple[int, PartitionRegistration]]:
    partitions = topic.partitions
    for pid in sorted(partitions):
        yield pid, partitions[pid]


def broker_leaving_changes(
    image: MetadataImage,
    settings: ControllerSettings,
    broker_id: int,
    resume: Resume | None = None,
    limit: int | None = None,
    also: frozenset[int] = frozenset(),
) -> tuple[Changes, Resume | None]:
    """Fencing, controlled shutdown or unregistration of ``broker_id`` (and of ``also``, fenced
    with it): drop them from every ISR (the last member stays) and move leadership away
    (kraft.controller.election), at most ``limit`` records from ``resume`` on; returns them and
    where the next step resumes."""
    return leaving_changes(
        image, broker_id, unclean_allowed_in(image, settings), limit, resume, also
    )


def unclean_allowed_in(
    image: MetadataImage, settings: ControllerSettings
) -> Callable[[TopicImage], bool]:
    """:func:`unclean_allowed` of ``image`` as the per-topic predicate the election rules take."""
    return lambda topic: unclean_allowed(image, settings, topic.name)


def broker_returning_changes(
    image: MetadataImage,
    settings: ControllerSettings,
    broker_id: int,
    limit: int | None = None,
    offline: frozenset[tuple[str, int]] = frozenset(),
    resume: Resume | None = None,
) -> tuple[Changes, Resume | None]:
    """Unfencing ``broker_id``: leaderless partitions it can lead get it as leader (except its
    replicas in ``offline``, on failed log dirs), at most ``limit`` records from ``resume`` on;
    returns them and where the next step resumes (kraft.controller.election)."""
    return returning_changes(
        image, broker_id, unclean_allowed_in(image, settings), limit, resume, offline
    )


def offline_replica_changes(
    image: MetadataImage,
    settings: ControllerSettings,
    broker_id: int,
    replicas: list[tuple[str, int]],
    limit: int | None = None,
) -> Changes:
    """Replicas of ``broker_id`` on an offline log dir: out of the ISR and leadership."""
    return changes_for_offline_replicas(
        image,
        broker_id,
        replicas,
        lambda topic: unclean_allowed(image, settings, topic.name),
        limit,
    )


# ---------------------------------------------------------------------------------------------
# Placement and assignments
# ---------------------------------------------------------------------------------------------


def place(
    image: MetadataImage,
    start_partition: int,
    num_partitions: int,
    replication_factor: int,
    rng: Any,
) -> list[list[int]]:
    """Replica lists for new partitions (raises INVALID_REPLICATION_FACTOR)."""
    brokers = [image.brokers[b] for b in sorted(image.brokers)]
    if replication_factor <= 0:
        raise _fail(
            ErrorCode.INVALID_REPLICATION_FACTOR, "Replication factor must be larger than 0."
        )
    if replication_factor > len(brokers):
        raise _fail(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"Unable to replicate the partition {replication_factor} time(s): The target "
            f"replication factor of {replication_factor} cannot be reached because only "
            f"{len(brokers)} broker(s) are registered.",
        )
    return [
        list(r)
        for r in place_replicas(brokers, start_partition, num_partitions, replication_factor, rng)
    ]


def check_replica_list(
    image: MetadataImage, pid: int, replicas: Any, rf: int | None
) -> tuple[int, ...]:
    """Validate one manual replica list: ints, no duplicates, registered brokers, the expected
    replication factor, at least one active replica. Raises INVALID_REPLICA_ASSIGNMENT."""
    if (
        not isinstance(replicas, (list, tuple))
        or not replicas
        or not all(_is_int(b) for b in replicas)
    ):
        raise _fail(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"The manual partition assignment for partition {pid} must be a non-empty list of broker ids.",
        )
    if len(set(replicas)) != len(replicas):
        raise _fail(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"The manual partition assignment for partition {pid} contains duplicate broker ids {list(replicas)}.",
        )
    if rf is not None and len(replicas) != rf:
        raise _fail(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"The manual partition assignment for partition {pid} has {len(replicas)} replica(s), "
            f"but other partitions have {rf}: all partitions must have the same replication factor.",
        )
    unknown = [b for b in replicas if b not in image.brokers]
    if unknown:
        raise _fail(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"The manual partition assignment for partition {pid} includes broker(s) {unknown} "
            "that are not registered.",
        )
    if not any(image.is_active_broker(b) for b in replicas):
        raise _fail(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"All brokers specified in the partition assignment for partition {pid} are fenced "
            "or in controlled shutdown.",
        )
    return tuple(replicas)


def _parse_assignments(image: MetadataImage, raw: Any) -> list[tuple[int, ...]]:
    """CreateTopics' manual assignment {partition: [broker ids]} → replica lists by partition."""
    if not isinstance(raw, dict):
        raise _fail(
            ErrorCode.INVALID_REQUEST, "assignments must be a map {partition: [broker ids]}."
        )
    by_pid: dict[int, Any] = {}
    for key, replicas in raw.items():
        pid = (
            key if _is_int(key) else (int(key) if isinstance(key, str) and key.isdigit() else None)
        )
        if pid is None or pid < 0 or pid in by_pid:
            raise _fail(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"Invalid partition id {key!r} in the manual assignment.",
            )
        by_pid[pid] = replicas
    for expected, pid in enumerate(sorted(by_pid)):
        if pid != expected:
            raise _fail(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"Partitions must be numbered 0..{len(by_pid) - 1} without gaps, but partition "
                f"{expected} is missing from the manual assignment.",
            )
    rf: int | None = None
    out = []
    for pid in range(len(by_pid)):
        replicas = check_replica_list(image, pid, by_pid[pid], rf)
        rf = len(replicas)
        out.append(replicas)
    return out


def new_partition(
    image: MetadataImage,
    topic_id: str,
    pid: int,
    replicas: tuple[int, ...],
    empty_isr_code: ErrorCode,
    active: frozenset[int] | None = None,
) -> PartitionRecord:
    """A PartitionRecord: ISR = the active replicas, leader = the first of them, epochs 0.
    ``active`` (the image's active broker ids, when the caller has them) saves looking each up."""
    if active is None:
        isr = tuple(b for b in replicas if image.is_active_broker(b))
    else:
        isr = (
            replicas
            if all(b in active for b in replicas)
            else tuple(b for b in replicas if b in active)
        )
    if not isr:
        raise _fail(
            empty_isr_code,
            f"Unable to create partition {pid}: none of its replicas "
            f"{list(replicas)} is unfenced and out of controlled shutdown.",
        )
    return PartitionRecord(pid, topic_id, replicas, isr, (), (), isr[0], RECOVERED, 0, 0)


def derive_topic_id(seed: int, name: str, taken: Callable[[str], bool]) -> str:
    """A deterministic version-4 UUID from the command seed and the topic name (re-derived with a
    counter in the astronomically unlikely case it is already taken)."""
    attempt = 0
    while True:
        digest = hashlib.sha256(f"{seed}\x00topic-id\x00{name}\x00{attempt}".encode()).digest()
        topic_id = str(uuid.UUID(bytes=digest[:16], version=4))
        if not taken(topic_id):
            return topic_id
        attempt += 1


def _duplicates(names: list[Any]) -> set[Any]:
    seen: set[Any] = set()
    dups: set[Any] = set()
    for n in names:
        if isinstance(n, str):
            (dups if n in seen else seen).add(n)
    return dups


def _limit_error(settings: ControllerSettings, needed: int) -> KraftError:
    return _fail(
        ErrorCode.POLICY_VIOLATION,
        f"The request needs {needed} records, more than the {settings.max_records_per_batch} "
        "allowed in one atomic batch.",
    )


# ---------------------------------------------------------------------------------------------
# CreateTopics
# ---------------------------------------------------------------------------------------------


def _optional_count(item: Mapping[str, Any], key: str) -> int:
    value = item.get(key)
    if value is None:
        return -1
    if not _is_int(value):
        raise _fail(ErrorCode.INVALID_REQUEST, f"{key} must be an integer.")
    return value


def _topic_configs(name: str, raw: Any) -> list[ConfigRecord]:
    if raw is None:
        return []
    if not isinstance(raw, dict):
        raise _fail(ErrorCode.INVALID_REQUEST, "configs must be a map {key: value}.")
    for key in raw:
        if not isinstance(key, str):
            raise _fail(ErrorCode.INVALID_CONFIG, f"Config names must be strings, got {key!r}.")
    return [
        ConfigRecord(RESOURCE_TOPIC, name, key, validate_value(RESOURCE_TOPIC, key, raw[key]))
        for key in sorted(raw)
    ]


def check_new_topic_name(image: MetadataImage, raw: Any, planned: Mapping[str, str]) -> str:
    """A legal name that no existing or planned topic has or collides with."""
    name = validate_topic_name(raw)
    if name in image.topics_by_name or name in planned:
        raise _fail(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
    other = find_collision(
        name,
        lambda n: n in image.topics_by_name or n in planned,
        lambda: [*image.topics_by_name, *planned],
    )
    if other is not None:
        raise collision_error(name, other)
    return name


def _create_topic(
    image: MetadataImage,
    settings: ControllerSettings,
    cmd: Command,
    item: Mapping[str, Any],
    planned: dict[str, str],
    budget: int,
) -> tuple[list[Record], dict[str, Any]]:
    name = check_new_topic_name(image, item.get("name"), planned)
    num_partitions = _optional_count(item, "num_partitions")
    replication_factor = _optional_count(item, "replication_factor")
    configs = _topic_configs(name, item.get("configs"))
    raw_assignments = item.get("assignments")
    if raw_assignments:
        if num_partitions != -1 or replication_factor != -1:
            raise _fail(
                ErrorCode.INVALID_REQUEST,
                "A manual partition assignment was given together with "
                "num_partitions or replication_factor; give only one.",
            )
        if not isinstance(raw_assignments, dict):
            raise _fail(
                ErrorCode.INVALID_REQUEST, "assignments must be a map {partition: [broker ids]}."
            )
        if len(raw_assignments) + 1 + len(configs) > budget:
            raise _limit_error(settings, len(raw_assignments) + 1 + len(configs))
        assignments = _parse_assignments(image, raw_assignments)
        empty_isr = ErrorCode.INVALID_REPLICA_ASSIGNMENT
    else:
        if num_partitions == -1:
            num_partitions = settings.num_partitions
        if replication_factor == -1:
            replication_factor = settings.default_replication_factor
        if num_partitions <= 0:
            raise _fail(ErrorCode.INVALID_PARTITIONS, "Number of partitions must be larger than 0.")
        if replication_factor <= 0:
            raise _fail(
                ErrorCode.INVALID_REPLICATION_FACTOR, "Replication factor must be larger than 0."
            )
        if num_partitions + 1 + len(configs) > budget:
            raise _limit_error(settings, num_partitions + 1 + len(configs))
        rng = derive_rng(cmd.seed, "placement", name)
        assignments = [tuple(r) for r in place(image, 0, num_partitions, replication_factor, rng)]
        empty_isr = ErrorCode.INVALID_REPLICATION_FACTOR
    planned_ids = set(planned.values())
    topic_id = derive_topic_id(
        cmd.seed, name, lambda t: t in image.topics_by_id or t in planned_ids
    )
    active = frozenset(b for b, reg in image.brokers.items() if reg.is_active)
    partitions = [
        new_partition(image, topic_id, pid, replicas, empty_isr, active)
        for pid, replicas in enumerate(assignments)
    ]
    records: list[Record] = [TopicRecord(name, topic_id), *configs, *partitions]
    result = {
        "name": name,
        "topic_id": topic_id,
        **error_fields(),
        "num_partitions": len(assignments),
        "replication_factor": len(assignments[0]),
    }
    return records, result


def _failed_topic(name: Any, error: KraftError) -> dict[str, Any]:
    return {
        "name": name if isinstance(name, str) else "",
        "topic_id": "",
        **error_fields(error),
        "num_partitions": -1,
        "replication_factor": -1,
    }


def create_topics(
    image: MetadataImage, cmd: Command, settings: ControllerSettings
) -> ControllerResult:
    """CreateTopics (docs/kraft-notes.md, Create topics): one atomic batch of TopicRecord, ConfigRecords and
    PartitionRecords per created topic; every topic gets its own result."""
    items = list(cmd.body["topics"])
    names = [item.get("name") if isinstance(item, dict) else None for item in items]
    duplicates = _duplicates(names)
    records: list[Record] = []
    results: list[dict[str, Any]] = []
    planned: dict[str, str] = {}
    over_limit: KraftError | None = None
    for item, name in zip(items, names):
        try:
            if not isinstance(item, dict):
                raise _fail(
                    ErrorCode.INVALID_REQUEST, "Each topic must be a map with at least a name."
                )
            if isinstance(name, str) and name in duplicates:
                raise _fail(
                    ErrorCode.INVALID_REQUEST,
                    f"Found multiple entries for topic '{name}' in one request.",
                )
            if over_limit is not None:  # the request fails anyway: only report other errors
                _topic_configs(check_new_topic_name(image, name, planned), item.get("configs"))
                raise over_limit
            budget = settings.max_records_per_batch - len(records)
            topic_records, result = _create_topic(image, settings, cmd, item, planned, budget)
        except KraftError as e:
            if e.code == ErrorCode.POLICY_VIOLATION and over_limit is None:
                over_limit = e
            results.append(_failed_topic(name, e))
            continue
        records.extend(topic_records)
        planned[result["name"]] = result["topic_id"]
        results.append(result)
    if over_limit is not None:  # atomic: the whole request fails
        records = []
        results = [r if r["error_code"] else _failed_topic(r["name"], over_limit) for r in results]
    if cmd.body.get("validate_only"):
        records = []
    reason = "auto-create" if cmd.body.get("auto_create") else "user-request"
    return ControllerResult(records, {"topics": results}, reason)


# ---------------------------------------------------------------------------------------------
# CreatePartitions
# ---------------------------------------------------------------------------------------------


def _create_partitions_for(
    image: MetadataImage,
    settings: ControllerSettings,
    cmd: Command,
    item: Mapping[str, Any],
    budget: int,
) -> list[Record]:
    name = item.get("name")
    topic = image.topic(name) if isinstance(name, str) else None
    if topic is None:
        raise _fail(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic '{name}' does not exist.")
    count = item.get("count")
    if not _is_int(count):
        raise _fail(ErrorCode.INVALID_REQUEST, "count must be an integer.")
    current = len(topic.partitions)
    if count < current:
        raise _fail(
            ErrorCode.INVALID_PARTITIONS,
            f"Topic '{name}' currently has {current} partition(s), "
            f"which is higher than the requested {count}.",
        )
    if count == current:
        raise _fail(
            ErrorCode.INVALID_PARTITIONS, f"Topic '{name}' already has {current} partition(s)."
        )
    added = count - current
    if added > budget:
        raise _limit_error(settings, added)
    rf = len(topic.partitions[0].replicas) if current else settings.default_replication_factor
    raw = item.get("assignments")
    if raw is not None:
        if not isinstance(raw, (list, tuple)) or len(raw) != added:
            got = len(raw) if isinstance(raw, (list, tuple)) else 0
            raise _fail(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"Attempted to add {added} additional partition(s), but {got} assignment(s) were specified.",
            )
        assignments = [check_replica_list(image, current + i, r, rf) for i, r in enumerate(raw)]
        empty_isr = ErrorCode.INVALID_REPLICA_ASSIGNMENT
    else:
        rng = derive_rng(cmd.seed, "placement", topic.name, str(current))
        assignments = [tuple(r) for r in place(image, current, added, rf, rng)]
        empty_isr = ErrorCode.INVALID_REPLICATION_FACTOR
    return [
        new_partition(image, topic.topic_id, current + i, replicas, empty_isr)
        for i, replicas in enumerate(assignments)
    ]


def create_partitions(
    image: MetadataImage, cmd: Command, settings: ControllerSettings
) -> ControllerResult:
    """CreatePartitions (docs/kraft-notes.md): grow topics; one PartitionRecord per new partition, atomically."""
    items = list(cmd.body["topics"])
    names = [item.get("name") if isinstance(item, dict) else None for item in items]
    duplicates = _duplicates(names)
    records: list[Record] = []
    results: list[dict[str, Any]] = []
    over_limit: KraftError | None = None
    for item, name in zip(items, names):
        try:
            if not isinstance(item, dict):
                raise _fail(
                    ErrorCode.INVALID_REQUEST,
                    "Each topic must be a map {name, count, assignments?}.",
                )
            if isinstance(name, str) and name in duplicates:
                raise _fail(
                    ErrorCode.INVALID_REQUEST,
                    f"Found multiple entries for topic '{name}' in one request.",
                )
            if over_limit is not None:
                raise over_limit
            topic_records = _create_partitions_for(
                image, settings, cmd, item, settings.max_records_per_batch - len(records)
            )
        except KraftError as e:
            if e.code == ErrorCode.POLICY_VIOLATION and over_limit is None:
                over_limit = e
            results.append({"name": name if isinstance(name, str) else "", **error_fields(e)})
            continue
        records.extend(topic_records)
        results.append({"name": name, **error_fields()})
    if over_limit is not None:
        records = []
        results = [
            r if r["error_code"] else {"name": r["name"], **error_fields(over_limit)}
            for r in results
        ]
    if cmd.body.get("validate_only"):
        records = []
    return ControllerResult(records, {"topics": results}, "user-request")


# ---------------------------------------------------------------------------------------------
# DeleteTopics
# ---------------------------------------------------------------------------------------------


def delete_topics(
    image: MetadataImage, cmd: Command, settings: ControllerSettings
) -> ControllerResult:
    """DeleteTopics (docs/kraft-notes.md) by name: one RemoveTopicRecord per topic, atomically."""
    names = list(cmd.body["names"])
    duplicates = _duplicates(names)
    records: list[Record] = []
    results: list[dict[str, Any]] = []
    for name in names:
        error: KraftError | None = None
        topic_id = image.topics_by_name.get(name) if isinstance(name, str) else None
        if not isinstance(name, str):
            error = _fail(ErrorCode.INVALID_REQUEST, f"Topic names must be strings, got {name!r}.")
        elif name in duplicates:
            error = _fail(
                ErrorCode.INVALID_REQUEST,
                f"Found multiple entries for topic '{name}' in one request.",
            )
        elif topic_id is None:
            error = _fail(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic '{name}' does not exist.")
        if error is not None:
            results.append(
                {
                    "name": name if isinstance(name, str) else "",
                    "topic_id": "",
                    **error_fields(error),
                }
            )
            continue
        assert topic_id is not None  # no error: the name is a topic's
        records.append(RemoveTopicRecord(topic_id))
        results.append({"name": name, "topic_id": topic_id, **error_fields()})
    if len(records) > settings.max_records_per_batch:
        error = _limit_error(settings, len(records))
        records = []
        results = [
            r if r["error_code"] else {**r, "topic_id": "", **error_fields(error)} for r in results
        ]
    return ControllerResult(records, {"topics": results}, "user-request")


# ---------------------------------------------------------------------------------------------
# ElectLeaders
# ---------------------------------------------------------------------------------------------


_ELECTION_MESSAGES = {
    ErrorCode.ELECTION_NOT_NEEDED: "Partition {name}-{pid} needs no {kind} election (leader {leader}).",
    ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE: "The preferred replica {preferred} of {name}-{pid} is not in the ISR or is not available.",
    ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE: "No replica of {name}-{pid} is available to lead.",
}


def _elect_one(
    image: MetadataImage,
    topic: TopicImage,
    pid: int,
    part: PartitionRegistration,
    election_type: str,
) -> PartitionChangeRecord:
    """One requested election; raises ELECTION_NOT_NEEDED / PREFERRED_LEADER_NOT_AVAILABLE /
    ELIGIBLE_LEADERS_NOT_AVAILABLE."""
    elect = elect_preferred_leader if election_type == "preferred" else elect_unclean_leader
    outcome = elect(topic.topic_id, pid, part, image.is_active_broker)
    if outcome.record is None:
        code = outcome.error if outcome.error != ErrorCode.NONE else ErrorCode.ELECTION_NOT_NEEDED
        raise _fail(
            code,
            _ELECTION_MESSAGES[code].format(
                name=topic.name,
                pid=pid,
                kind=election_type,
                leader=part.leader,
                preferred=part.preferred_leader,
            ),
        )
    return outcome.record


def _election_result(
    topic: str, pid: int, leader: int, error: KraftError | None = None
) -> dict[str, Any]:
    return {"topic": topic, "partition": pid, "leader": leader, **error_fields(error)}


def elect_leaders(
    image: MetadataImage, cmd: Command, settings: ControllerSettings
) -> ControllerResult:
    """ElectLeaders: preferred or unclean elections for the listed partitions, or for all (then
    partitions that need no election are not reported, and the pass stops at the batch limit)."""
    election_type = cmd.body["election_type"]
    reason = f"{election_type}-election"
    if election_type not in ("preferred", "unclean"):
        return ControllerResult(
            [],
            {
                **error_fields(
                    _fail(
                        ErrorCode.INVALID_REQUEST,
                        f"election_type must be 'preferred' or 'unclean', got {election_type!r}.",
                    )
                ),
                "partitions": [],
            },
            reason,
        )
    listed = cmd.body.get("partitions")
    records: list[Record] = []
    results: list[dict[str, Any]] = []
    if listed is None:
        for topic in _topics_by_name(image):
            for pid, part in _sorted_partitions(topic):
                if len(records) >= settings.max_records_per_batch:
                    break
                try:
                    change = _elect_one(image, topic, pid, part, election_type)
                except KraftError as e:
                    if e.code != ErrorCode.ELECTION_NOT_NEEDED:
                        results.append(_election_result(topic.name, pid, part.leader, e))
                    continue
                records.append(change)
                results.append(_election_result(topic.name, pid, change.leader))
        return ControllerResult(records, {**error_fields(), "partitions": results}, reason)
    seen: set[tuple[str, int]] = set()
    for entry in listed:
        name = entry.get("topic") if isinstance(entry, dict) else None
        raw_pid = entry.get("partition") if isinstance(entry, dict) else None
        shown_name, shown_pid = (
            (name if isinstance(name, str) else ""),
            (raw_pid if _is_int(raw_pid) else -1),
        )
        listed_topic = image.topic(name) if isinstance(name, str) else None
        listed_part = (
            listed_topic.partitions.get(raw_pid)
            if listed_topic is not None and _is_int(raw_pid)
            else None
        )
        try:
            if not isinstance(name, str) or not _is_int(raw_pid):
                raise _fail(
                    ErrorCode.INVALID_REQUEST,
                    "Each partition must be a map {topic: str, partition: int}.",
                )
            if (name, raw_pid) in seen:
                raise _fail(
                    ErrorCode.INVALID_REQUEST,
                    f"Partition {name}-{raw_pid} is listed more than once.",
                )
            seen.add((name, raw_pid))
            if listed_topic is None or listed_part is None:
                raise _fail(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"Partition {name}-{raw_pid} does not exist.",
                )
            change = _elect_one(image, listed_topic, raw_pid, listed_part, election_type)
        except KraftError as e:
            leader = listed_part.leader if listed_part else LEADER_NONE
            results.append(_election_result(shown_name, shown_pid, leader, e))
            continue
        records.append(change)
        results.append(_election_result(name, raw_pid, change.leader))
    if len(records) > settings.max_records_per_batch:
        error = _limit_error(settings, len(records))
        records = []
        results = [r if r["error_code"] else {**r, **error_fields(error)} for r in results]
    return ControllerResult(records, {**error_fields(), "partitions": results}, reason)


# ---------------------------------------------------------------------------------------------
# AlterPartition (leader -> controller ISR changes)
# ---------------------------------------------------------------------------------------------


def _partition_view(part: PartitionRegistration | None) -> dict[str, Any]:
    if part is None:
        return {
            "leader": LEADER_NONE,
            "leader_epoch": -1,
            "partition_epoch": -1,
            "isr": [],
            "leader_recovery_state": RECOVERED,
        }
    return {
        "leader": part.leader,
        "leader_epoch": part.leader_epoch,
        "partition_epoch": part.partition_epoch,
        "isr": list(part.isr),
        "leader_recovery_state": part.leader_recovery_state,
    }


def _check_alter(
    image: MetadataImage,
    broker_id: int,
    part: PartitionRegistration,
    name: str,
    pid: int,
    req: Mapping[str, Any],
) -> tuple[tuple[int, ...], int]:
    """Kafka's AlterPartition checks, in order (docs/kraft-notes.md, AlterPartition). Returns (new ISR, new recovery state)."""
    leader_epoch, partition_epoch, isr = (
        req.get("leader_epoch"),
        req.get("partition_epoch"),
        req.get("isr"),
    )
    recovery = req.get("leader_recovery_state")
    if not (
        _is_int(leader_epoch)
        and _is_int(partition_epoch)
        and isinstance(isr, (list, tuple))
        and all(_is_int(b) for b in isr)
        and (recovery is None or _is_int(recovery))
    ):
        raise _fail(
            ErrorCode.INVALID_REQUEST,
            "Each partition needs integer leader_epoch, partition_epoch, "
            "a list of broker ids as isr, and an optional integer leader_recovery_state.",
        )
    if leader_epoch > part.leader_epoch or partition_epoch > part.partition_epoch:
        raise _fail(
            ErrorCode.NOT_CONTROLLER,
            f"{name}-{pid}: the request's epochs (leader {leader_epoch}, partition {partition_epoch}) are "
            f"newer than the controller's ({part.leader_epoch}, {part.partition_epoch}).",
        )
    if leader_epoch < part.leader_epoch:
        raise _fail(
            ErrorCode.FENCED_LEADER_EPOCH,
            f"{name}-{pid}: leader epoch {leader_epoch} is older than the current {part.leader_epoch}.",
        )
    if broker_id != part.leader:
        raise _fail(
            ErrorCode.INVALID_REQUEST,
            f"{name}-{pid}: broker {broker_id} is not the leader ({part.leader}).",
        )
    if partition_epoch < part.partition_epoch:
        raise _fail(
            ErrorCode.INVALID_UPDATE_VERSION,
            f"{name}-{pid}: partition epoch {partition_epoch} is older than the current {part.partition_epoch}.",
        )
    new_isr = tuple(isr)
    if (
        len(set(new_isr)) != len(new_isr)
        or not set(new_isr) <= set(part.replicas)
        or part.leader not in new_isr
    ):
        raise _fail(
            ErrorCode.INVALID_REQUEST,
            f"{name}-{pid}: the ISR {list(new_isr)} must be distinct replicas "
            f"of {list(part.replicas)} and include the leader {part.leader}.",
        )
    new_recovery = part.leader_recovery_state if recovery is None else recovery
    if new_recovery not in (RECOVERED, RECOVERING):
        raise _fail(
            ErrorCode.INVALID_REQUEST,
            f"{name}-{pid}: unknown leader recovery state {new_recovery}.",
        )
    if new_recovery == RECOVERING and part.leader_recovery_state == RECOVERED:
        raise _fail(
            ErrorCode.INVALID_REQUEST,
            f"{name}-{pid}: a recovered leader cannot go back to RECOVERING.",
        )
    if new_recovery == RECOVERING and len(new_isr) > 1:
        raise _fail(
            ErrorCode.INVALID_REQUEST,
            f"{name}-{pid}: a RECOVERING partition's ISR must be the leader alone.",
        )
    for b in new_isr:
        reg = image.broker(b)
        state = (
            "not registered"
            if reg is None
            else "in controlled shutdown"
            if reg.in_controlled_shutdown
            else "fenced"
            if reg.fenced
            else None
        )
        if state is not None:
            raise _fail(
                ErrorCode.INELIGIBLE_REPLICA,
                f"{name}-{pid}: broker {b} cannot join the ISR: it is {state}.",
            )
    return new_isr, new_recovery


def _isr_reason(req: Mapping[str, Any], old: tuple[int, ...], new: tuple[int, ...]) -> str:
    given = req.get("reason")
    if isinstance(given, str) and given:
        return given
    if set(new) < set(old):
        return "isr-shrink"
    if set(new) > set(old):
        return "isr-expand"
    return "isr-change"


def alter_partition(
    image: MetadataImage, cmd: Command, settings: ControllerSettings
) -> ControllerResult:
    """AlterPartition from a partition leader: validated ISR / recovery-state changes."""
    body = cmd.body
    broker_id, broker_epoch = body["broker_id"], body["broker_epoch"]
    reg = image.broker(broker_id)
    if reg is None or reg.epoch != broker_epoch:
        why = "is not registered" if reg is None else f"has epoch {reg.epoch}, not {broker_epoch}"
        return ControllerResult(
            [],
            {
                **error_fields(_fail(ErrorCode.STALE_BROKER_EPOCH, f"Broker {broker_id} {why}.")),
                "topics": [],
            },
            "isr-change",
        )
    records: list[Record] = []
    reasons: list[str] = []
    topics_out: list[dict[str, Any]] = []
    seen: set[tuple[str, int]] = set()
    for t in body["topics"]:
        topic_id = t.get("topic_id") if isinstance(t, dict) else None
        parts_in = t.get("partitions") if isinstance(t, dict) else None
        topic = image.topic_by_id(topic_id) if isinstance(topic_id, str) else None
        parts_out: list[dict[str, Any]] = []
        for req in parts_in if isinstance(parts_in, (list, tuple)) else []:
            pid = req.get("partition") if isinstance(req, dict) else None
            part = topic.partitions.get(pid) if topic is not None and _is_int(pid) else None
            try:
                if not isinstance(req, dict) or not _is_int(pid):
                    raise _fail(
                        ErrorCode.INVALID_REQUEST,
                        "Each partition must be a map with an integer partition.",
                    )
                if topic is None:
                    raise _fail(ErrorCode.UNKNOWN_TOPIC_ID, f"Unknown topic id {topic_id!r}.")
                if part is None:
                    raise _fail(
                        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                        f"Unknown partition {topic.name}-{pid}.",
                    )
                if (topic_id, pid) in seen:
                    raise _fail(
                        ErrorCode.INVALID_REQUEST,
                        f"Partition {topic.name}-{pid} is listed more than once.",
                    )
                seen.add((topic.topic_id, pid))
                new_isr, new_recovery = _check_alter(image, broker_id, part, topic.name, pid, req)
            except KraftError as e:
                parts_out.append(
                    {
                        "partition": pid if _is_int(pid) else -1,
                        **error_fields(e),
                        **_partition_view(part),
                    }
                )
                continue
            change = build_partition_change(
                topic.topic_id,
                pid,
                part,
                image.is_active_broker,
                target_isr=new_isr,
                target_recovery_state=new_recovery,
            )
            after = part
            if change is not None:
                records.append(change)
                reasons.append(_isr_reason(req, part.isr, new_isr))
                after = part.merge(change)
            parts_out.append({"partition": pid, **error_fields(), **_partition_view(after)})
        topics_out.append(
            {"topic_id": topic_id if isinstance(topic_id, str) else "", "partitions": parts_out}
        )
    distinct = sorted(set(reasons))
    reason = distinct[0] if len(distinct) == 1 else "isr-change"
    return ControllerResult(records, {**error_fields(), "topics": topics_out}, reason)
