"""Brokers (Kafka's ClusterControlManager): registration, unregistration, fencing, unfencing,
controlled shutdown, and producer-id blocks handed to brokers.

Fencing, controlled shutdown and unregistration are not atomic in Kafka: when a broker's ISR and
leadership changes exceed one batch, each command moves one batch worth and answers
``"incomplete": true``; the node repeats the command until it is complete (for UnfenceBroker,
with ``"continue": true`` in the body, since the broker is already unfenced by then).

Pure handlers ``(image, command, settings) -> ControllerResult``. A broker's epoch is the offset
of its latest RegisterBrokerRecord (docs/kraft-notes.md, Epochs and ids); requests that quote an epoch must quote
the current one (STALE_BROKER_EPOCH).
"""

from __future__ import annotations

import uuid
from typing import Any

from kraft.controller.commands import Command, ControllerResult, error_fields
from kraft.controller.election import Resume
from kraft.controller.replication_control import (
    broker_leaving_changes,
    broker_returning_changes,
    offline_replica_changes,
)
from kraft.controller.settings import ControllerSettings
from kraft.errors import ErrorCode, KraftError
from kraft.metadata.image import MetadataImage
from kraft.metadata.registrations import BrokerRegistration
from kraft.records import (
    FENCE,
    FENCE_UNCHANGED,
    UNFENCE,
    BrokerRegistrationChangeRecord,
    ProducerIdsRecord,
    Record,
    RegisterBrokerRecord,
    UnregisterBrokerRecord,
)

_ENDPOINT_KEYS = {"name": str, "host": str, "port": int, "security_protocol": str}
_FEATURE_KEYS = {"name": str, "min_version": int, "max_version": int}
MAX_BROKER_ID = (1 << 31) - 1  # Kafka's broker ids are int32 (the audit's columns too)


def _maps(raw: Any, spec: dict[str, type], what: str) -> tuple[dict[str, Any], ...]:
    """Validate a list of maps with exactly ``spec``'s keys and types (INVALID_REQUEST)."""
    if raw is None:
        return ()
    out = []
    for item in raw if isinstance(raw, (list, tuple)) else [None]:
        if (
            not isinstance(item, dict)
            or set(item) != set(spec)
            or any(type(item[k]) is not t for k, t in spec.items())
        ):
            raise KraftError(
                ErrorCode.INVALID_REQUEST,
                f"each of {what} must be a map {{{', '.join(spec)}}} "
                f"with the right types, got {item!r}",
            )
        out.append({k: item[k] for k in spec})
    return tuple(out)


def checked_broker(image: MetadataImage, broker_id: int, broker_epoch: int) -> BrokerRegistration:
    """The registration of ``broker_id`` if ``broker_epoch`` is its current epoch, else
    STALE_BROKER_EPOCH (as Kafka's checkBrokerEpoch, also for an unregistered broker)."""
    reg = image.broker(broker_id)
    if reg is None:
        raise KraftError(
            ErrorCode.STALE_BROKER_EPOCH, f"No broker registration found for broker id {broker_id}."
        )
    if reg.epoch != broker_epoch:
        raise KraftError(
            ErrorCode.STALE_BROKER_EPOCH,
            f"Expected broker epoch {reg.epoch} for broker {broker_id}, but got {broker_epoch}.",
        )
    return reg


def _unsupported_features(image: MetadataImage, features: tuple[dict[str, Any], ...]) -> str | None:
    """A finalized feature level the broker does not support (a feature it does not list
    supports only level 0), described, or None."""
    ranges = {f["name"]: (f["min_version"], f["max_version"]) for f in features}
    for name in sorted(image.features):
        level = image.features[name]
        low, high = ranges.get(name, (0, 0))
        if not low <= level <= high:
            return (
                f"the cluster's {name} is at level {level}, but the broker supports {low}..{high}"
            )
    return None


def register_broker(
    image: MetadataImage, cmd: Command, settings: ControllerSettings
) -> ControllerResult:
    """BrokerRegistration (docs/kraft-notes.md, Broker registration): RegisterBrokerRecord, fenced. A new incarnation's epoch is the
    record's offset; the same incarnation amends its registration and keeps epoch and state. A
    new incarnation may replace an unfenced registration only with its disks' proof
    (:func:`returning_disks`); the active controller has checked that the old session expired."""
    body = cmd.body
    broker_id = body["broker_id"]
    try:
        if body["cluster_id"] != settings.cluster_id:
            raise KraftError(
                ErrorCode.INCONSISTENT_CLUSTER_ID,
                f"Expected cluster id {settings.cluster_id!r}, but broker {broker_id} "
                f"sent {body['cluster_id']!r}.",
            )
        if not 0 <= broker_id <= MAX_BROKER_ID:
            raise KraftError(
                ErrorCode.INVALID_REQUEST,
                f"Broker id must be between 0 and {MAX_BROKER_ID}, got {broker_id}.",
            )
        try:
            incarnation = str(uuid.UUID(body["incarnation_id"]))
        except ValueError:
            raise KraftError(
                ErrorCode.INVALID_REQUEST,
                f"incarnation_id must be a UUID, got {body['incarnation_id']!r}.",
            ) from None
        endpoints = _maps(body["listeners"], _ENDPOINT_KEYS, "listeners")
        features_given = body.get("features")
        features = _maps(features_given, _FEATURE_KEYS, "features")
        rack = body.get("rack") or None
        if rack is not None and not isinstance(rack, str):
            raise KraftError(ErrorCode.INVALID_REQUEST, "rack must be a string.")
        existing = image.broker(broker_id)
        if (
            existing is not None
            and existing.incarnation_id != incarnation
            and not existing.fenced
            and not returning_disks(existing, body)
        ):
            raise KraftError(
                ErrorCode.DUPLICATE_BROKER_REGISTRATION,
                f"Another broker {broker_id} (incarnation {existing.incarnation_id}) is registered "
                "and alive; retry once its session has expired.",
            )
        if features_given is not None:
            problem = _unsupported_features(image, features)
            if problem is not None:
                raise KraftError(
                    ErrorCode.UNSUPPORTED_VERSION, f"Broker {broker_id} cannot join: {problem}."
                )
    except KraftError as e:
        return ControllerResult([], {**error_fields(e), "broker_epoch": -1}, "broker-registration")
    if existing is not None and existing.incarnation_id == incarnation:
        epoch, fenced, shutting_down = (
            existing.epoch,
            existing.fenced,
            existing.in_controlled_shutdown,
        )
    else:
        epoch, fenced, shutting_down = image.offset + 1, True, False
    record = RegisterBrokerRecord(
        broker_id, incarnation, epoch, endpoints, features, rack, fenced, shutting_down
    )
    return ControllerResult(
        [record], {**error_fields(), "broker_epoch": epoch}, "broker-registration"
    )


def returning_disks(existing: BrokerRegistration, body: dict[str, Any]) -> bool:
    """Whether a new incarnation's ``previous_broker_epoch`` is ``existing``'s epoch: its disks are
    the ones that registration served from (``broker.broker_epoch``), so replacing it keeps the
    broker's leaderships and ISR places, as Kafka does after a clean shutdown (KIP-966). The
    new registration is fenced until the broker has caught up; a broker without that proof (a
    wiped disk, an offline dir) may only replace a fenced registration."""
    previous = body.get("previous_broker_epoch")
    return type(previous) is int and previous >= 0 and previous == existing.epoch


def unregister_broker(
    image: MetadataImage, cmd: Command, settings: ControllerSettings, pending: Resume | None = None
) -> ControllerResult:
    """UnregisterBroker: drop it from ISRs and leadership, then UnregisterBrokerRecord."""
    broker_id = cmd.body["broker_id"]
    reg = image.broker(broker_id)
    if reg is None:
        error = KraftError(
            ErrorCode.BROKER_ID_NOT_REGISTERED, f"Broker {broker_id} is not registered."
        )
        return ControllerResult([], error_fields(error), "user-request")
    return _leave(
        image,
        settings,
        broker_id,
        [],
        [UnregisterBrokerRecord(broker_id, reg.epoch)],
        "user-request",
        pending=pending,
    )


def _transition(
    image: MetadataImage, cmd: Command, reason: str
) -> BrokerRegistration | ControllerResult:
    """Common checks of fence/unfence/shutdown commands: the registration, or an error result."""
    try:
        return checked_broker(image, cmd.body["broker_id"], cmd.body["broker_epoch"])
    except KraftError as stale:
        e = stale
        if image.broker(cmd.body["broker_id"]) is None:
            e = KraftError(
                ErrorCode.BROKER_ID_NOT_REGISTERED,
                f"Broker {cmd.body['broker_id']} is not registered.",
            )
        return ControllerResult([], error_fields(e), reason)


def _leave(
    image: MetadataImage,
    settings: ControllerSettings,
    broker_id: int,
    first: list[Record],
    last: list[Record],
    reason: str,
    pending: Resume | None = None,
    also: frozenset[int] = frozenset(),
) -> ControllerResult:
    """``first`` + the partition changes of ``broker_id`` (and ``also``) leaving + ``last``,
    split if needed:
    a step holds at most ``settings.step_records`` records, so a broker with more partitions
    moves them over several commands. A step that filled up omits ``last``, answers
    ``{"incomplete": true}`` and returns where the next step resumes as ``pending``; repeating
    the same command continues. ``pending`` from the previous step (given only when nothing
    else was written since) saves rescanning the partitions before it (see
    ``election.leaving_changes``), so every step costs O(its records)."""
    room = settings.step_records - len(first)
    changes, resume = broker_leaving_changes(
        image, settings, broker_id, pending, room - len(last), also
    )
    if resume is None:
        return ControllerResult([*first, *changes, *last], error_fields(), reason)
    return ControllerResult(
        [*first, *changes], {**error_fields(), "incomplete": True}, reason, pending=resume
    )


def fence_broker(
    image: MetadataImage, cmd: Command, settings: ControllerSettings, pending: Resume | None = None
) -> ControllerResult:
    """FenceBroker (session timeout or want_fence): leave ISRs and leadership, then fenced=1
    (written last, so a fenced broker has left everything). Already fenced: nothing to write.
    ``also`` in the body (``[{broker_id, broker_epoch}]``, the session timer's other brokers
    whose sessions expired at the same time) are fenced with it: each partition changes once
    for all of them. Those no longer registered with that epoch, or already fenced, are left
    out."""
    reason = cmd.body.get("reason") or "session-timeout"
    reg = _transition(image, cmd, reason)
    if isinstance(reg, ControllerResult):
        return reg
    if reg.fenced:
        return ControllerResult([], error_fields(), reason)
    others = also_fenced(image, cmd.body.get("also"), reg.broker_id)
    fences: list[Record] = [
        BrokerRegistrationChangeRecord(r.broker_id, r.epoch, FENCE, 0) for r in (reg, *others)
    ]
    return _leave(
        image,
        settings,
        reg.broker_id,
        [],
        fences,
        reason,
        pending=pending,
        also=frozenset(r.broker_id for r in others),
    )


def also_fenced(image: MetadataImage, raw: Any, broker_id: int) -> list[BrokerRegistration]:
    """The registrations named by a FenceBroker's ``also`` that are current and unfenced, by id."""
    found: dict[int, BrokerRegistration] = {}
    for item in raw if isinstance(raw, (list, tuple)) else ():
        if not isinstance(item, dict):
            continue
        b, epoch = item.get("broker_id"), item.get("broker_epoch")
        if type(b) is not int or type(epoch) is not int or b == broker_id:
            continue
        other = image.broker(b)
        if other is not None and other.epoch == epoch and not other.fenced:
            found[b] = other
    return [found[b] for b in sorted(found)]


def unfence_broker(
    image: MetadataImage, cmd: Command, settings: ControllerSettings, pending: Resume | None = None
) -> ControllerResult:
    """UnfenceBroker (caught up): fenced=-1, then leaderless partitions it can lead get it, a
    step at a time (``{"incomplete": true}`` while some are left; the node repeats the command
    with ``continue``). ``pending``: where the previous step stopped, or where a search in
    slices found the first change (see ``election.returning_changes``)."""
    reason = "broker-unfenced"
    reg = _transition(image, cmd, reason)
    if isinstance(reg, ControllerResult):
        return reg
    if reg.in_controlled_shutdown:
        error = KraftError(
            ErrorCode.INVALID_REQUEST,
            f"Broker {reg.broker_id} is in controlled shutdown; it must register again.",
        )
        return ControllerResult([], error_fields(error), reason)
    first: list[Record] = (
        [BrokerRegistrationChangeRecord(reg.broker_id, reg.epoch, UNFENCE, 0)] if reg.fenced else []
    )
    if not first and not incomplete_continuation(cmd):
        return ControllerResult([], error_fields(), reason)
    room = settings.step_records - len(first)
    offline = frozenset(offline_replicas_of(cmd.body))
    changes, resume = broker_returning_changes(
        image, settings, reg.broker_id, room, offline, pending
    )
    if resume is None:
        return ControllerResult([*first, *changes], error_fields(), reason)
    return ControllerResult(
        [*first, *changes], {**error_fields(), "incomplete": True}, reason, pending=resume
    )


def incomplete_continuation(cmd: Command) -> bool:
    """Whether the node repeats a command that answered ``incomplete`` (body ``continue: true``)."""
    return cmd.body.get("continue") is True


def begin_controlled_shutdown(
    image: MetadataImage, cmd: Command, settings: ControllerSettings, pending: Resume | None = None
) -> ControllerResult:
    """BeginControlledShutdown: in_controlled_shutdown=1, then leave ISRs and leadership. A
    fenced broker: nothing to write. Already shutting down: only what is left to move (if an
    earlier step was incomplete)."""
    reason = "controlled-shutdown"
    reg = _transition(image, cmd, reason)
    if isinstance(reg, ControllerResult):
        return reg
    if reg.fenced:
        return ControllerResult([], error_fields(), reason)
    first: list[Record] = (
        []
        if reg.in_controlled_shutdown
        else [BrokerRegistrationChangeRecord(reg.broker_id, reg.epoch, FENCE_UNCHANGED, 1)]
    )
    return _leave(image, settings, reg.broker_id, first, [], reason, pending=pending)


def offline_replicas_of(body: dict[str, Any]) -> list[tuple[str, int]]:
    """A body's ``offline_replicas`` ([{topic_id, partition}]) as (topic id, partition) pairs."""
    raw = body.get("offline_replicas")
    return [
        (r["topic_id"], r["partition"])
        for r in (raw if isinstance(raw, (list, tuple)) else ())
        if isinstance(r, dict)
        and isinstance(r.get("topic_id"), str)
        and type(r.get("partition")) is int
    ]


def log_dirs_offline(
    image: MetadataImage, cmd: Command, settings: ControllerSettings
) -> ControllerResult:
    """LogDirsOffline (issued by the active controller from a heartbeat's offline log dirs,
    KIP-858): the listed replicas of the broker leave ISRs and leadership, at most one step of
    records; the next heartbeat repeats it for whatever is left. A fenced broker has left
    everything already: nothing to write."""
    reason = "log-dir-offline"
    reg = _transition(image, cmd, reason)
    if isinstance(reg, ControllerResult):
        return reg
    if reg.fenced:
        return ControllerResult([], error_fields(), reason)
    replicas = offline_replicas_of(cmd.body)
    changes = offline_replica_changes(
        image, settings, reg.broker_id, replicas, limit=settings.step_records
    )
    response = (
        error_fields()
        if not changes.remaining
        else {**error_fields(), "incomplete": True, "remaining": changes.remaining}
    )
    return ControllerResult(list(changes), response, reason)


def allocate_producer_ids(
    image: MetadataImage, cmd: Command, settings: ControllerSettings
) -> ControllerResult:
    """AllocateProducerIds: the next block of ``settings.producer_id_block_size`` ids."""
    reason = "producer-id-block"
    try:
        reg = checked_broker(image, cmd.body["broker_id"], cmd.body["broker_epoch"])
    except KraftError as e:
        return ControllerResult(
            [], {**error_fields(e), "producer_id_start": -1, "producer_id_len": 0}, reason
        )
    start, size = image.next_producer_id, settings.producer_id_block_size
    if start + size > 2**63 - 1:
        error = KraftError(ErrorCode.UNKNOWN_SERVER_ERROR, "Producer ids are exhausted.")
        return ControllerResult(
            [], {**error_fields(error), "producer_id_start": -1, "producer_id_len": 0}, reason
        )
    record = ProducerIdsRecord(reg.broker_id, reg.epoch, start + size)
    return ControllerResult(
        [record], {**error_fields(), "producer_id_start": start, "producer_id_len": size}, reason
    )
