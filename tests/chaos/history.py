"""The history checker: what clients were told versus what the metadata log says.

Pure: the runner records operations (:class:`History`) and collects facts from the cluster (the
controllers' logs, brokers' image checksums, Raft leadership reports); the ``check_*`` functions
return :class:`Anomaly` values, an empty list meaning the run was correct.

Availability (:func:`check_availability`): from the log's batch timestamps, the moments when
every registered broker was fenced and the partitions without a leader; either is an anomaly
unless a fault on one of the brokers concerned (or one that took a controller majority away)
explains it.

Operation outcomes are ``ok`` (acknowledged), ``fail`` (a definite error: nothing may have been
applied) and ``info`` (indeterminate: timed out or connection lost; it may or may not have been
applied, at most once). The workload creates each topic name at most once and issues one
operation at a time per topic, so each topic's expected state is a set of possibilities.
"""

from __future__ import annotations

import re
import threading
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.registrations import PartitionRegistration
from kraft.records import (
    RESOURCE_TOPIC,
    Batch,
    LeaderChangeRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RemoveTopicRecord,
    TopicRecord,
)

OK, FAIL, INFO = "ok", "fail", "info"
KINDS = ("create", "delete", "partitions", "config")


@dataclass
class Op:
    """One client operation on one topic. ``args``: create {partitions}, partitions {count},
    config {key, value}, delete {}."""

    id: int
    kind: str
    topic: str
    request_id: str
    args: dict[str, Any]
    invoke_s: float
    complete_s: float | None = None
    outcome: str | None = None
    error: str = ""


@dataclass(frozen=True)
class Anomaly:
    kind: str
    detail: str


class History:
    """Thread-safe record of operations in invocation order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ops: list[Op] = []

    def invoke(
        self, kind: str, topic: str, request_id: str, args: dict[str, Any], now: float
    ) -> Op:
        if kind not in KINDS:
            raise ValueError(f"unknown operation kind {kind!r}")
        with self._lock:
            op = Op(len(self.ops), kind, topic, request_id, dict(args), now)
            self.ops.append(op)
            return op

    def complete(self, op: Op, outcome: str, now: float, error: str = "") -> None:
        if outcome not in (OK, FAIL, INFO):
            raise ValueError(f"unknown outcome {outcome!r}")
        op.outcome, op.complete_s, op.error = outcome, now, error

    def counts(self) -> dict[str, int]:
        c = Counter(op.outcome or INFO for op in self.ops)
        return {OK: c[OK], FAIL: c[FAIL], INFO: c[INFO]}


# ---- facts from the metadata log ---------------------------------------------------------------


@dataclass
class LogFacts:
    """What one controller's metadata log says, scanned batch by batch."""

    final: MetadataImage = MetadataImage.EMPTY
    request_batches: Counter[str] = field(default_factory=Counter)  # request id -> batches
    topic_records: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    removals: Counter[str] = field(default_factory=Counter)  # topic id -> RemoveTopic count
    leader_changes: list[tuple[int, int]] = field(default_factory=list)  # (term, leader id)
    leader_epochs: list[tuple[str, int, int, int]] = field(default_factory=list)
    #                          (topic id, partition, leader epoch, leader) in log order
    checksums: dict[int, str] = field(default_factory=dict)  # requested offset -> checksum
    batch_ends: set[int] = field(default_factory=set)  # last offset of every batch
    outages: list[Outage] = field(default_factory=list)  # in order of their start
    fences: list[tuple[int, int, str]] = field(default_factory=list)  # (ms, broker, reason)


@dataclass(frozen=True)
class Outage:
    """A stretch of the log's timeline (batch timestamps, wall-clock ms) when every registered
    broker was fenced (``what`` = ``all-fenced``, ``nodes``: those brokers) or one partition
    had no leader (``leaderless``, ``nodes``: its replicas). ``end_ms`` None: still open when
    the log ends."""

    what: str
    start_ms: int
    end_ms: int | None
    nodes: frozenset[int]
    detail: str


@dataclass(frozen=True)
class FaultWindow:
    """When a fault made ``nodes`` unhealthy: from its injection until the cluster had
    recovered (wall-clock ms). ``quorum_lost``: it took a majority of controllers away."""

    kind: str
    nodes: frozenset[int]
    start_ms: int
    end_ms: int
    quorum_lost: bool = False


class _OutageTracker:
    """Builds :class:`Outage` values while :func:`scan_log` replays batches."""

    def __init__(self, out: list[Outage], fences: list[tuple[int, int, str]]) -> None:
        self.out = out
        self.fences = fences
        self.fenced: frozenset[int] = frozenset()
        self.seen_unfenced = False  # no outage before the cluster was first up
        self.all_fenced: tuple[int, frozenset[int]] | None = None
        self.leaderless: dict[tuple[str, int], tuple[int, frozenset[int]]] = {}

    def after_batch(self, image: MetadataImage, touched: set[tuple[str, int]], reason: str) -> None:
        now = image.timestamp_ms
        fenced = frozenset(b for b, reg in image.brokers.items() if reg.fenced)
        self.fences += [(now, b, reason) for b in sorted(fenced - self.fenced)]
        self.fenced = fenced
        everyone = bool(image.brokers) and len(fenced) == len(image.brokers)
        if not everyone and len(fenced) < len(image.brokers):
            self.seen_unfenced = True
        if everyone and self.seen_unfenced and self.all_fenced is None:
            self.all_fenced = (now, fenced)
        elif not everyone and self.all_fenced is not None:
            self._close_all_fenced(now)
        for key in touched:
            topic = image.topics_by_id.get(key[0])
            part = None if topic is None else topic.partitions.get(key[1])
            if part is not None and part.leader < 0:
                self.leaderless.setdefault(key, (now, frozenset(part.replicas)))
            elif key in self.leaderless:
                start, replicas = self.leaderless.pop(key)
                self.out.append(Outage("leaderless", start, now, replicas, f"{key[0]}/{key[1]}"))

    def _close_all_fenced(self, end: int | None) -> None:
        assert self.all_fenced is not None
        start, fenced = self.all_fenced
        self.out.append(Outage("all-fenced", start, end, fenced, f"brokers {sorted(fenced)}"))
        self.all_fenced = None

    def finish(self) -> None:
        if self.all_fenced is not None:
            self._close_all_fenced(None)
        for (tid, pid), (start, replicas) in sorted(self.leaderless.items()):
            self.out.append(Outage("leaderless", start, None, replicas, f"{tid}/{pid}"))
        self.out.sort(key=lambda o: o.start_ms)


def scan_log(batches: Iterable[Batch], checksum_at: Iterable[int] = ()) -> LogFacts:
    """Replay ``batches`` (from offset 0) and collect :class:`LogFacts`; image checksums are
    computed only at the offsets in ``checksum_at``."""
    wanted = set(checksum_at)
    facts = LogFacts()
    image = MetadataImage.EMPTY
    parts: dict[tuple[str, int], PartitionRegistration] = {}
    outages = _OutageTracker(facts.outages, facts.fences)
    for batch in batches:
        touched: set[tuple[str, int]] = set()
        if batch.provenance.request_id:
            facts.request_batches[batch.provenance.request_id] += 1
        for r in batch.records:
            if isinstance(r, TopicRecord):
                facts.topic_records[r.name].append(r.topic_id)
            elif isinstance(r, RemoveTopicRecord):
                facts.removals[r.topic_id] += 1
                touched.update(k for k in outages.leaderless if k[0] == r.topic_id)
            elif isinstance(r, LeaderChangeRecord):
                facts.leader_changes.append((r.term, r.leader_id))
            elif isinstance(r, PartitionRecord):
                reg = parts[(r.topic_id, r.partition_id)] = PartitionRegistration.from_record(r)
                facts.leader_epochs.append(
                    (r.topic_id, r.partition_id, reg.leader_epoch, reg.leader)
                )
                touched.add((r.topic_id, r.partition_id))
            elif isinstance(r, PartitionChangeRecord):
                key = (r.topic_id, r.partition_id)
                if key in parts:
                    reg = parts[key] = parts[key].merge(r)
                    facts.leader_epochs.append((*key, reg.leader_epoch, reg.leader))
                    touched.add(key)
        delta = MetadataDelta(image)
        delta.replay_batch(batch)
        image = delta.apply()
        facts.batch_ends.add(image.offset)
        if image.offset in wanted:
            facts.checksums[image.offset] = image.checksum()
        outages.after_batch(image, touched, batch.provenance.reason)
    outages.finish()
    facts.final = image
    return facts


# ---- checks ------------------------------------------------------------------------------------


def check_operations(ops: Iterable[Op], facts: LogFacts) -> list[Anomaly]:
    """Acknowledged writes are in the log exactly once, failed ones not at all, indeterminate
    ones at most once; no topic was created that nobody asked for; the final image matches what
    the acknowledged operations imply."""
    anomalies: list[Anomaly] = []
    by_topic: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        by_topic[op.topic].append(op)
        n = facts.request_batches.get(op.request_id, 0)
        outcome = op.outcome or INFO
        if (
            (outcome == OK and n != 1)
            or (outcome == FAIL and n != 0)
            or (outcome == INFO and n > 1)
        ):
            anomalies.append(
                Anomaly(
                    "applied-count",
                    f"{op.kind} {op.topic} ({op.request_id}) was {outcome} but is in {n} batch(es)",
                )
            )
    for name, ids in facts.topic_records.items():
        creates = [op for op in by_topic.get(name, []) if op.kind == "create"]
        if not creates:
            anomalies.append(
                Anomaly("phantom-topic", f"topic {name} was created but never requested")
            )
        elif len(ids) > len(creates):
            anomalies.append(
                Anomaly(
                    "duplicate-create",
                    f"topic {name} created {len(ids)} times for {len(creates)} request(s)",
                )
            )
    for name, topic_ops in by_topic.items():
        anomalies += _check_topic_state(name, topic_ops, facts.final)
    return anomalies


def _check_topic_state(name: str, ops: list[Op], final: MetadataImage) -> list[Anomaly]:
    exists: set[bool] = {False}
    counts: set[int] = set()
    configs: dict[str, set[str | None]] = {}
    for op in sorted(ops, key=lambda o: o.invoke_s):
        outcome = op.outcome or INFO
        if outcome == FAIL:
            continue
        sure = outcome == OK
        if op.kind == "create":
            exists, counts = _after(exists, True, sure), _after(counts, op.args["partitions"], sure)
        elif op.kind == "delete":
            exists = _after(exists, False, sure)
        elif op.kind == "partitions":
            counts = _after(counts, op.args["count"], sure)
        elif op.kind == "config":
            key = op.args["key"]
            configs[key] = _after(configs.get(key, {None}), op.args["value"], sure)
    topic = final.topic(name)
    out: list[Anomaly] = []
    if (topic is not None) not in exists:
        out.append(
            Anomaly(
                "lost-write" if topic is None else "resurrected-topic",
                f"topic {name} {'missing' if topic is None else 'present'} at the end; "
                f"the history allows exists in {sorted(exists)}",
            )
        )
    if topic is None or out:
        return out
    if len(topic.partitions) not in counts:
        out.append(
            Anomaly(
                "partition-count",
                f"topic {name} has {len(topic.partitions)} partitions; "
                f"the history allows {sorted(counts)}",
            )
        )
    actual = final.config(RESOURCE_TOPIC, name)
    for key, allowed in configs.items():
        if actual.get(key) not in allowed:
            out.append(
                Anomaly(
                    "config-value",
                    f"topic {name} {key}={actual.get(key)!r}; the history "
                    f"allows {sorted(allowed, key=str)}",
                )
            )
    return out


_T = TypeVar("_T")


def _after(possible: set[_T], value: _T, sure: bool) -> set[_T]:
    return {value} if sure else possible | {value}


def check_logs_identical(digests: Mapping[int, tuple[int, str]]) -> list[Anomaly]:
    """Every controller's (next offset, stream digest) is the same."""
    if len(set(digests.values())) <= 1:
        return []
    detail = ", ".join(
        f"controller {n}: next offset {d[0]} sha {d[1][:12]}" for n, d in sorted(digests.items())
    )
    return [Anomaly("log-divergence", detail)]


def check_images(observed: Mapping[int, tuple[int, str]], facts: LogFacts) -> list[Anomaly]:
    """Each node's (applied offset, image checksum) (brokers' and controllers' own reports)
    equals the image the scanned log has at that offset."""
    out = []
    for node_id, (offset, checksum) in sorted(observed.items()):
        expected = facts.checksums.get(offset)
        if expected is None:
            out.append(
                Anomaly(
                    "image-offset",
                    f"node {node_id} reports offset {offset}, which "
                    "ends no batch of the controller log",
                )
            )
        elif expected != checksum:
            out.append(
                Anomaly(
                    "image-checksum",
                    f"node {node_id} image at offset {offset} is "
                    f"{checksum[:12]}, the log's is {expected[:12]}",
                )
            )
    return out


def check_leader_epochs(
    log_epochs: Iterable[tuple[str, int, int, int]],
    observed: Iterable[tuple[str, int, int, int]] = (),
) -> list[Anomaly]:
    """Per partition, leader epochs in the log never go down, and no (partition, leader epoch)
    ever had two leaders, in the log or in ``observed`` (e.g. brokers' partition states)."""
    out: list[Anomaly] = []
    last: dict[tuple[str, int], int] = {}
    leaders: dict[tuple[str, int, int], int] = {}
    for tid, pid, epoch, leader in log_epochs:
        if epoch < last.get((tid, pid), -1):
            out.append(
                Anomaly(
                    "leader-epoch-regressed",
                    f"{tid}/{pid}: leader epoch {epoch} after {last[(tid, pid)]}",
                )
            )
        last[(tid, pid)] = max(epoch, last.get((tid, pid), -1))
        out += _same_epoch(leaders, tid, pid, epoch, leader, "log")
    for tid, pid, epoch, leader in observed:
        out += _same_epoch(leaders, tid, pid, epoch, leader, "observed")
    return out


def _same_epoch(
    leaders: dict[tuple[str, int, int], int], tid: str, pid: int, epoch: int, leader: int, src: str
) -> list[Anomaly]:
    prev = leaders.setdefault((tid, pid, epoch), leader)
    if prev != leader:
        return [
            Anomaly(
                "two-leaders-one-epoch",
                f"{tid}/{pid} leader epoch {epoch}: leaders {prev} and {leader} ({src})",
            )
        ]
    return []


_LEADER_LINE = re.compile(r"raft member (\d+): leader in term (\d+)")


def leader_reports(node_log: str) -> list[tuple[int, int]]:
    """(term, node id) for every "raft member N: leader in term T" line of a controller's log.

    ``kraft.quorum.raft`` writes that line on PySyncObj's own thread when leadership changes, so
    state and term are read together; a status read from another thread (DescribeNode) can
    catch a leader that has just adopted a higher term but not yet stepped down."""
    return [(int(t), int(n)) for n, t in _LEADER_LINE.findall(node_log)]


def check_raft_terms(
    leader_changes: Iterable[tuple[int, int]], self_reports: Iterable[tuple[int, int]] = ()
) -> list[Anomaly]:
    """Never two leaders in one Raft term: (term, leader id) from LeaderChange records and from
    controllers' own leadership reports (:func:`leader_reports`)."""
    leaders: dict[int, set[int]] = defaultdict(set)
    for term, leader_id in [*leader_changes, *self_reports]:
        leaders[term].add(leader_id)
    return [
        Anomaly("two-leaders-one-term", f"term {t}: leaders {sorted(ids)}")
        for t, ids in sorted(leaders.items())
        if len(ids) > 1
    ]


def check_availability(
    outages: Iterable[Outage],
    faults: Iterable[FaultWindow],
    window: tuple[int, int],
    max_leaderless_ms: int,
) -> list[Anomaly]:
    """Within ``window`` (wall-clock ms: while faults were being injected), every broker fenced
    at once is an anomaly, and so is a partition without a leader for longer than
    ``max_leaderless_ms`` — unless a fault overlapping the outage explains it: one on a broker
    concerned (every fenced broker; one of the partition's replicas), or one that took a
    controller majority away (no controller could elect a partition leader)."""
    faults = list(faults)
    lo, hi = window
    out: list[Anomaly] = []
    for o in outages:
        start, end = max(o.start_ms, lo), min(hi if o.end_ms is None else o.end_ms, hi)
        if end < start or (o.what == "leaderless" and end - start <= max_leaderless_ms):
            continue
        near = [f for f in faults if f.start_ms <= end and start <= f.end_ms]
        if any(f.quorum_lost for f in near):
            continue
        hit = frozenset().union(*(f.nodes for f in near))
        shown = f"{(end - start) / 1000:.1f}s" + ("" if o.end_ms is not None else "+")
        if o.what == "all-fenced" and not o.nodes <= hit:
            out.append(
                Anomaly(
                    "all-brokers-fenced",
                    f"{o.detail} all fenced for {shown} from {o.start_ms}; faults then: "
                    f"{[f.kind for f in near] or 'none'}",
                )
            )
        elif o.what == "leaderless" and not o.nodes & hit:
            out.append(
                Anomaly(
                    "leaderless-partition",
                    f"{o.detail} (replicas {sorted(o.nodes)}) had no leader for {shown} from "
                    f"{o.start_ms} with its replicas and a controller majority unfaulted",
                )
            )
    return out


def unexplained_fences(
    fences: Iterable[tuple[int, int, str]], faults: Iterable[FaultWindow], window: tuple[int, int]
) -> list[tuple[int, int, str]]:
    """Session-timeout fences within ``window`` of brokers no overlapping fault was aimed at
    (a healthy broker that lost its session, e.g. to a stalled controller)."""
    faults = list(faults)
    return [
        (ms, b, reason)
        for ms, b, reason in fences
        if reason == "session-timeout"
        and window[0] <= ms <= window[1]
        and not any(f.start_ms <= ms <= f.end_ms and b in f.nodes for f in faults)
    ]
