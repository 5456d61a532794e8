"""What changed in the metadata between two points of its history (``kraft log diff``).

:func:`diff` replays a :class:`~tools.log_reader.History` to the ``--from`` point with
:mod:`kraft.metadata.replay`, then walks each later batch record by record against the image before it,
turning records into :class:`Change` values: topics created/deleted, partition leader/ISR/replica
changes (with leader epochs and the election type), broker registrations and fence/unfence/
controlled-shutdown transitions, config changes old → new, feature levels and controller
failovers — each with who asked (principal, client id) and why (the batch's provenance reason
and API).

Points are offsets or times. A point means "after the batch holding that offset" (batches are
atomic), or for a time "after the last batch written at or before it".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kraft.metadata.delta import ReplayError
from kraft.metadata.image import MetadataImage
from kraft.metadata.registrations import BrokerRegistration, PartitionRegistration
from kraft.metadata.replay import replay
from kraft.records import (
    FENCE,
    RESOURCE_BROKER,
    RESOURCE_TOPIC,
    UNFENCE,
    Batch,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    FeatureLevelRecord,
    LeaderChangeRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    Record,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnregisterBrokerRecord,
)
from tools.log_reader import History, LogReadError

EPOCH_MS_MIN = 10**12  # integers at least this big are epoch milliseconds (after 2001-09-09)
_ISO_RE = re.compile(r"^\d{4}-\d{2}-\d{2}([T ].*)?$")


# ------------------------------------------------------------------------------ points in time


@dataclass(frozen=True, slots=True)
class Point:
    """A ``--from``/``--to`` argument: an offset, or a time in epoch milliseconds."""

    offset: int | None = None
    timestamp_ms: int | None = None

    def resolve(self, history: History) -> int:
        """The offset this point stands for in ``history``."""
        if self.offset is not None:
            return self.offset
        assert self.timestamp_ms is not None  # a point is an offset or a time
        return history.offset_at_time(self.timestamp_ms)


def parse_point(text: str) -> Point:
    """An offset (``42``, ``-1`` = before the first record), epoch milliseconds (an integer of 13
    or more digits) or an ISO-8601 time (no zone = UTC). Raises ValueError."""
    text = text.strip()
    if re.fullmatch(r"-?\d+", text):
        value = int(text)
        if value >= EPOCH_MS_MIN:
            return Point(timestamp_ms=value)
        if value < -1:
            raise ValueError(f"offset must be >= -1, got {value}")
        return Point(offset=value)
    if _ISO_RE.match(text):
        try:
            when = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"not an ISO-8601 time: {text!r}") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return Point(timestamp_ms=int(when.timestamp() * 1000))
    raise ValueError(f"{text!r} is neither an offset, epoch milliseconds nor an ISO-8601 time")


def iso_time(timestamp_ms: int) -> str:
    """``2026-11-22T10:00:00.123Z``."""
    when = datetime.fromtimestamp(timestamp_ms / 1000, tz=UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{timestamp_ms % 1000:03d}Z"


# ------------------------------------------------------------------------------ changes


@dataclass(frozen=True, slots=True)
class Change:
    """One change. ``kind`` is one of: topic-created, topic-deleted, partition-created,
    partition-changed, broker-registered, broker-unregistered, broker-fenced, broker-unfenced,
    broker-controlled-shutdown, config-changed, feature-changed, controller-activated,
    producer-ids. ``subject`` names what changed; ``details`` holds old/new values."""

    offset: int
    timestamp_ms: int
    term: int
    kind: str
    subject: str
    details: dict[str, Any]
    principal: str
    client_id: str
    api: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "offset": self.offset,
            "timestamp_ms": self.timestamp_ms,
            "time": iso_time(self.timestamp_ms),
            "term": self.term,
            "kind": self.kind,
            "subject": self.subject,
            **self.details,
            "principal": self.principal,
            "client_id": self.client_id,
            "api": self.api,
            "reason": self.reason,
        }


@dataclass(slots=True)
class Diff:
    """The changes between the image at ``start`` and the image at ``end``."""

    start: MetadataImage
    end: MetadataImage
    batches: int
    records: int
    changes: list[Change] = field(default_factory=list)

    def of_kind(self, *kinds: str) -> list[Change]:
        return [c for c in self.changes if c.kind in kinds]

    def summary(self) -> dict[str, int]:
        """Counts per kind, plus partition elections and ISR shrinks/expansions."""
        counts: dict[str, int] = {}
        for c in self.changes:
            counts[c.kind] = counts.get(c.kind, 0) + 1
        parts = self.of_kind("partition-changed")
        counts["leader-elections"] = sum("leader-election" in c.details["changes"] for c in parts)
        counts["isr-shrinks"] = sum("isr-shrink" in c.details["changes"] for c in parts)
        counts["isr-expansions"] = sum("isr-expand" in c.details["changes"] for c in parts)
        return counts

    def to_json(self) -> dict[str, Any]:
        return {
            "from": _point_json(self.start),
            "to": _point_json(self.end),
            "batches": self.batches,
            "records": self.records,
            "summary": self.summary(),
            "changes": [c.to_json() for c in self.changes],
        }


def _point_json(image: MetadataImage) -> dict[str, Any]:
    return {
        "offset": image.offset,
        "timestamp_ms": image.timestamp_ms,
        "time": iso_time(image.timestamp_ms) if image.timestamp_ms else None,
        "checksum": image.checksum(),
    }


def diff(history: History, start: Point, end: Point) -> Diff:
    """The changes from ``start`` to ``end`` (``start`` <= ``end``). Raises LogReadError for a
    point outside the history or a reversed window."""
    lo, hi = start.resolve(history), end.resolve(history)
    if lo > hi:
        raise LogReadError(f"--from (offset {lo}) is after --to (offset {hi})")
    if lo < history.base.offset:
        raise LogReadError(
            f"offset {lo} is before the start of this history "
            f"(offset {history.base.offset}; earlier records were compacted into "
            "a snapshot)"
        )
    first, last = history.batch_index_through(lo), history.batch_index_through(hi)
    image = history.image_at(lo)
    out = Diff(image, image, last - first, 0)
    for batch in history.batches[first:last]:
        out.changes.extend(batch_changes(image, batch))
        out.records += len(batch.records)
        try:
            image = replay(image, (batch,))
        except ReplayError as e:
            raise LogReadError(f"replay failed: {e}") from None
    out.end = image
    return out


def batch_changes(image: MetadataImage, batch: Batch) -> list[Change]:
    """The changes ``batch`` makes to ``image`` (the image just before it)."""
    return _BatchWalk(image, batch).run()


class _BatchWalk:
    """Records of one batch against the image before it, with the batch's own earlier records
    overlaid (a batch can create a topic and then change its partitions)."""

    def __init__(self, image: MetadataImage, batch: Batch) -> None:
        self.image = image
        self.batch = batch
        self.names: dict[str, str] = {}  # topic id -> name, topics created in this batch
        self.partitions: dict[tuple[str, int], PartitionRegistration] = {}
        self.brokers: dict[int, BrokerRegistration | None] = {}
        self.configs: dict[tuple[int, str, str], str | None] = {}
        self.out: list[Change] = []
        self.offset = batch.base_offset

    def run(self) -> list[Change]:
        handlers: dict[type[Record], Callable[[Any], None]] = {
            TopicRecord: self._topic,
            PartitionRecord: self._partition,
            PartitionChangeRecord: self._partition_change,
            RemoveTopicRecord: self._remove_topic,
            RegisterBrokerRecord: self._register,
            UnregisterBrokerRecord: self._unregister,
            BrokerRegistrationChangeRecord: self._broker_change,
            ConfigRecord: self._config,
            FeatureLevelRecord: self._feature,
            LeaderChangeRecord: self._leader_change,
            ProducerIdsRecord: self._producer_ids,
        }
        for i, record in enumerate(self.batch.records):
            self.offset = self.batch.base_offset + i
            handler = handlers.get(type(record))
            if handler is not None:
                handler(record)
        return self.out

    def _add(self, kind: str, subject: str, **details: Any) -> None:
        p = self.batch.provenance
        self.out.append(
            Change(
                self.offset,
                self.batch.timestamp_ms,
                self.batch.term,
                kind,
                subject,
                details,
                p.principal,
                p.client_id,
                p.api,
                p.reason,
            )
        )

    def _name(self, topic_id: str) -> str:
        if topic_id in self.names:
            return self.names[topic_id]
        topic = self.image.topic_by_id(topic_id)
        return topic.name if topic is not None else topic_id

    def _old_partition(self, topic_id: str, pid: int) -> PartitionRegistration | None:
        key = (topic_id, pid)
        return (
            self.partitions[key] if key in self.partitions else self.image.partition(topic_id, pid)
        )

    # ---- topics and partitions ----------------------------------------------------------------

    def _topic(self, r: TopicRecord) -> None:
        self.names[r.topic_id] = r.name
        partitions = sum(
            1
            for rec in self.batch.records
            if type(rec) is PartitionRecord and rec.topic_id == r.topic_id
        )
        self._add(
            "topic-created",
            f"topic {r.name}",
            topic=r.name,
            topic_id=r.topic_id,
            partitions=partitions,
        )

    def _partition(self, r: PartitionRecord) -> None:
        reg = PartitionRegistration.from_record(r)
        self.partitions[(r.topic_id, r.partition_id)] = reg
        if r.topic_id in self.names:
            return  # part of a topic created in this batch: reported with the topic
        self._add(
            "partition-created",
            f"{self._name(r.topic_id)}-{r.partition_id}",
            topic=self._name(r.topic_id),
            partition=r.partition_id,
            replicas=list(reg.replicas),
            isr=list(reg.isr),
            leader=reg.leader,
        )

    def _partition_change(self, r: PartitionChangeRecord) -> None:
        old = self._old_partition(r.topic_id, r.partition_id)
        if old is None:
            return  # replay would have refused it; the log verifier reports such logs
        new = old.merge(r)
        self.partitions[(r.topic_id, r.partition_id)] = new
        name = self._name(r.topic_id)
        self._add(
            "partition-changed",
            f"{name}-{r.partition_id}",
            topic=name,
            partition=r.partition_id,
            changes=classify(old, new, r),
            election=r.election,
            leader=[old.leader, new.leader],
            leader_epoch=[old.leader_epoch, new.leader_epoch],
            isr=[list(old.isr), list(new.isr)],
            replicas=[list(old.replicas), list(new.replicas)],
            partition_epoch=[old.partition_epoch, new.partition_epoch],
        )

    def _remove_topic(self, r: RemoveTopicRecord) -> None:
        topic = self.image.topic_by_id(r.topic_id)
        name = self._name(r.topic_id)
        self._add(
            "topic-deleted",
            f"topic {name}",
            topic=name,
            topic_id=r.topic_id,
            partitions=len(topic.partitions) if topic is not None else 0,
        )

    # ---- brokers -----------------------------------------------------------------------------

    def _old_broker(self, broker_id: int) -> BrokerRegistration | None:
        return (
            self.brokers[broker_id]
            if broker_id in self.brokers
            else self.image.brokers.get(broker_id)
        )

    def _register(self, r: RegisterBrokerRecord) -> None:
        old = self._old_broker(r.broker_id)
        self.brokers[r.broker_id] = BrokerRegistration.from_record(r)
        self._add(
            "broker-registered",
            f"broker {r.broker_id}",
            broker_id=r.broker_id,
            epoch=[old.epoch if old else None, r.broker_epoch],
            rack=r.rack,
            fenced=r.fenced,
            incarnation_id=r.incarnation_id,
            endpoints=[f"{e['name']}://{e['host']}:{e['port']}" for e in r.endpoints],
        )

    def _unregister(self, r: UnregisterBrokerRecord) -> None:
        self.brokers[r.broker_id] = None
        self._add(
            "broker-unregistered",
            f"broker {r.broker_id}",
            broker_id=r.broker_id,
            epoch=r.broker_epoch,
        )

    def _broker_change(self, r: BrokerRegistrationChangeRecord) -> None:
        subject = f"broker {r.broker_id}"
        if r.fenced == FENCE:
            self._add("broker-fenced", subject, broker_id=r.broker_id, epoch=r.broker_epoch)
        elif r.fenced == UNFENCE:
            self._add("broker-unfenced", subject, broker_id=r.broker_id, epoch=r.broker_epoch)
        if r.in_controlled_shutdown:
            self._add(
                "broker-controlled-shutdown", subject, broker_id=r.broker_id, epoch=r.broker_epoch
            )

    # ---- configs, features, controller -------------------------------------------------------

    def _config(self, r: ConfigRecord) -> None:
        key = (r.resource_type, r.resource_name, r.name)
        old = (
            self.configs[key]
            if key in self.configs
            else (self.image.config(r.resource_type, r.resource_name).get(r.name))
        )
        self.configs[key] = r.value
        resource = resource_label(r.resource_type, r.resource_name)
        self._add(
            "config-changed",
            f"{resource} {r.name}",
            resource=resource,
            key=r.name,
            old=old,
            new=r.value,
        )

    def _feature(self, r: FeatureLevelRecord) -> None:
        self._add(
            "feature-changed",
            f"feature {r.name}",
            feature=r.name,
            level=[self.image.features.get(r.name), r.feature_level],
        )

    def _leader_change(self, r: LeaderChangeRecord) -> None:
        self._add(
            "controller-activated",
            f"controller {r.leader_id}",
            controller_id=r.leader_id,
            previous=self.image.controller_id,
            raft_term=r.term,
        )

    def _producer_ids(self, r: ProducerIdsRecord) -> None:
        self._add(
            "producer-ids",
            f"broker {r.broker_id}",
            broker_id=r.broker_id,
            next_producer_id=r.next_producer_id,
        )


def classify(
    old: PartitionRegistration, new: PartitionRegistration, change: PartitionChangeRecord
) -> list[str]:
    """What a partition change did: leader-election, isr-shrink, isr-expand, reassignment,
    leader-recovery (in that order; several can apply)."""
    kinds = []
    if change.leader != -2:
        kinds.append("leader-election")
    if set(old.isr) - set(new.isr):
        kinds.append("isr-shrink")
    if set(new.isr) - set(old.isr):
        kinds.append("isr-expand")
    if (
        new.replicas != old.replicas
        or new.adding_replicas != old.adding_replicas
        or new.removing_replicas != old.removing_replicas
    ):
        kinds.append("reassignment")
    if new.leader_recovery_state != old.leader_recovery_state:
        kinds.append("leader-recovery")
    return kinds


def resource_label(resource_type: int, name: str) -> str:
    if resource_type == RESOURCE_TOPIC:
        return f"topic {name}"
    if resource_type == RESOURCE_BROKER:
        return f"broker {name}" if name else "broker defaults"
    return f"resource {resource_type}:{name}"


# ------------------------------------------------------------------------------ rendering

_SECTIONS = (
    ("Topics", ("topic-created", "topic-deleted", "partition-created")),
    (
        "Brokers",
        (
            "broker-registered",
            "broker-unregistered",
            "broker-fenced",
            "broker-unfenced",
            "broker-controlled-shutdown",
        ),
    ),
    ("Partitions", ("partition-changed",)),
    ("Configs", ("config-changed",)),
    ("Controllers and features", ("controller-activated", "feature-changed", "producer-ids")),
)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "es" if noun.endswith("h") else "s")


def _ids(values: list[int]) -> str:
    return ",".join(map(str, values)) if values else "-"


def _leader(value: int) -> str:
    return "none" if value < 0 else str(value)


def describe(change: Change) -> str:
    """One line saying what ``change`` did (without who/why)."""
    d, s = change.details, change.subject
    if change.kind in ("topic-created", "topic-deleted"):
        return (
            f"{s} {change.kind.removeprefix('topic-')} ({_count(d['partitions'], 'partition')}, "
            f"id {d['topic_id']})"
        )
    if change.kind == "partition-created":
        return (
            f"partition {s} created: replicas {_ids(d['replicas'])}, leader {_leader(d['leader'])}"
        )
    if change.kind == "broker-registered":
        old = d["epoch"][0]
        again = (
            f"re-registered (epoch {old} -> {d['epoch'][1]})"
            if old is not None
            else f"registered (epoch {d['epoch'][1]})"
        )
        rack = f", rack {d['rack']}" if d["rack"] else ""
        return f"{s} {again}{rack}, {'fenced' if d['fenced'] else 'unfenced'}"
    if change.kind.startswith("broker-"):
        what = change.kind.removeprefix("broker-").replace("-", " ")
        return f"{s} {what} (epoch {d['epoch']})"
    if change.kind == "partition-changed":
        parts = []
        if d["leader"][0] != d["leader"][1] or "leader-election" in d["changes"]:
            how = f", {d['election']} election" if d["election"] else ""
            parts.append(
                f"leader {_leader(d['leader'][0])} -> {_leader(d['leader'][1])} "
                f"(epoch {d['leader_epoch'][0]} -> {d['leader_epoch'][1]}{how})"
            )
        if d["isr"][0] != d["isr"][1]:
            tag = (
                " shrink"
                if "isr-shrink" in d["changes"]
                else (" expand" if "isr-expand" in d["changes"] else "")
            )
            parts.append(f"ISR{tag} {_ids(d['isr'][0])} -> {_ids(d['isr'][1])}")
        if d["replicas"][0] != d["replicas"][1]:
            parts.append(f"replicas {_ids(d['replicas'][0])} -> {_ids(d['replicas'][1])}")
        return f"{s}: " + ("; ".join(parts) or f"partition epoch {d['partition_epoch'][1]}")
    if change.kind == "config-changed":
        old = "(unset)" if d["old"] is None else d["old"]
        new = "(deleted)" if d["new"] is None else d["new"]
        return f"{d['resource']}: {d['key']} {old} -> {new}"
    if change.kind == "controller-activated":
        prev = f" (was {d['previous']})" if d["previous"] >= 0 else ""
        return f"controller {d['controller_id']} became active in term {d['raft_term']}{prev}"
    if change.kind == "feature-changed":
        return f"{s} level {d['level'][0]} -> {d['level'][1]}"
    if change.kind == "producer-ids":
        return f"producer ids up to {d['next_producer_id']} allocated to {s}"
    return s


def who_why(change: Change) -> str:
    """``by PRINCIPAL (client CLIENT) via API: REASON``."""
    who = change.principal or "?"
    if change.client_id:
        who += f" (client {change.client_id})"
    why = change.reason or "-"
    return f"by {who} via {change.api or '?'}: {why}"


def render(result: Diff) -> str:
    """The readable summary: a header, then per section one line per change with its offset,
    time and who/why."""
    s, e = result.start, result.end
    head = (
        f"Metadata changes after offset {s.offset}"
        + (f" ({iso_time(s.timestamp_ms)})" if s.timestamp_ms else "")
        + f" through offset {e.offset}"
        + (f" ({iso_time(e.timestamp_ms)})" if e.timestamp_ms else "")
        + f": {_count(result.records, 'record')} in {_count(result.batches, 'batch')}"
    )
    lines = [head]
    if not result.changes:
        lines.append("No changes.")
    for title, kinds in _SECTIONS:
        changes = result.of_kind(*kinds)
        if not changes:
            continue
        lines += ["", f"{title}:"]
        for c in changes:
            lines.append(f"  [{c.offset} {iso_time(c.timestamp_ms)}] {describe(c)}")
            lines.append(f"      {who_why(c)}")
    counts = result.summary()
    lines += [
        "",
        "Summary: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if v)
        if any(counts.values())
        else "",
    ]
    return "\n".join(lines).rstrip()
