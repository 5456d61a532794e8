"""Consumer-group administration over the Kafka protocol, for ``kraft groups``: find a group's
coordinator, describe it (members, assignments, committed offsets, log-end offsets, lag; a
consumer-protocol group through ConsumerGroupDescribe, with its epochs), list offsets by
timestamp on partition leaders. Imports kio, so the CLI loads it only when a
``kraft groups`` command runs."""

from __future__ import annotations

import argparse
import os
import struct
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from tools.commands.common import (
    CLUSTER_DIR_ENV,
    UsageError,
    parse_endpoints,
)
from tools.kafka_wire import KafkaWire

BOOTSTRAP_SERVER_ENV = "KRAFT_BOOTSTRAP_SERVER"
EARLIEST, LATEST = -2, -1


class GroupCommandError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _check(code: Any, what: str) -> None:
    code = ErrorCode(int(getattr(code, "value", code)))
    if code != ErrorCode.none:
        raise GroupCommandError(code, f"{what}: {code.name.upper()}")


# ---- connections -----------------------------------------------------------------------------


class Brokers:
    """Connections to a cluster's brokers, opened on demand."""

    def __init__(self, bootstrap: list[tuple[str, int]], timeout: float) -> None:
        self.timeout = timeout
        self.bootstrap = bootstrap
        self.conns: dict[tuple[str, int], KafkaWire] = {}
        self.nodes: dict[int, tuple[str, int]] = {}
        self.leaders: dict[tuple[str, int], int] = {}

    def conn(self, address: tuple[str, int]) -> KafkaWire:
        if address not in self.conns:
            self.conns[address] = KafkaWire(*address, timeout=self.timeout)
        return self.conns[address]

    def any(self) -> KafkaWire:
        last: Exception | None = None
        for address in self.bootstrap:
            try:
                return self.conn(address)
            except OSError as e:
                last = e
        raise GroupCommandError(
            ErrorCode.network_exception, f"no broker reachable at {self.bootstrap}: {last}"
        )

    def metadata(self, topics: list[str] | None = None) -> Any:
        resp = self.any().call(
            3,
            12,
            {
                "topics": None
                if topics is None
                else [{"name": t, "topic_id": None} for t in topics],
                "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False,
            },
        )
        self.nodes = {b.node_id: (b.host, b.port) for b in resp.brokers}
        for t in resp.topics:
            for p in t.partitions:
                self.leaders[(t.name, p.partition_index)] = p.leader_id
        return resp

    def coordinator(self, group: str) -> KafkaWire:
        resp = self.any().call(10, 4, {"key_type": 0, "coordinator_keys": [group]})
        c = resp.coordinators[0]
        _check(c.error_code, f"finding the coordinator of group '{group}'")
        return self.conn((c.host, c.port))

    def close(self) -> None:
        for c in self.conns.values():
            c.close()


def bootstrap(args: argparse.Namespace) -> list[tuple[str, int]]:
    if args.bootstrap_server:
        return parse_endpoints(args.bootstrap_server)
    cluster = args.cluster or os.environ.get(CLUSTER_DIR_ENV)
    if not cluster and os.environ.get(BOOTSTRAP_SERVER_ENV):
        return parse_endpoints(os.environ[BOOTSTRAP_SERVER_ENV])
    if cluster:
        from tools.cluster import read_cluster_json

        try:
            layout = read_cluster_json(Path(cluster))
        except FileNotFoundError:
            raise UsageError(f"{cluster} holds no cluster.json") from None
        if not layout.brokers:
            raise UsageError(f"{cluster}/cluster.json lists no brokers")
        return [(b.host, b.port) for b in layout.brokers]
    raise UsageError("no broker to talk to: pass --bootstrap-server HOST:PORT or --cluster DIR")


# ---- protocol payloads -----------------------------------------------------------------------


def parse_assignment(data: bytes) -> dict[str, list[int]]:
    """A ConsumerProtocolAssignment: topic -> partitions (empty if unreadable)."""
    out: dict[str, list[int]] = {}
    try:
        pos = 2
        (n,) = struct.unpack_from(">i", data, pos)
        pos += 4
        for _ in range(max(0, n)):
            (size,) = struct.unpack_from(">h", data, pos)
            topic = data[pos + 2 : pos + 2 + size].decode()
            pos += 2 + size
            (count,) = struct.unpack_from(">i", data, pos)
            pos += 4
            out[topic] = list(struct.unpack_from(f">{max(0, count)}i", data, pos))
            pos += 4 * max(0, count)
    except (struct.error, UnicodeDecodeError):
        return {}
    return out


def list_offsets(
    brokers: Brokers, partitions: list[tuple[str, int]], ts: int
) -> dict[tuple[str, int], int]:
    """(topic, partition) -> offset for timestamp ``ts`` (-1 latest, -2 earliest), by leader."""
    brokers.metadata(sorted({t for t, _ in partitions}))
    by_leader: dict[int, list[tuple[str, int]]] = {}
    for tp in partitions:
        by_leader.setdefault(brokers.leaders.get(tp, -1), []).append(tp)
    out: dict[tuple[str, int], int] = {}
    for leader, tps in by_leader.items():
        if leader not in brokers.nodes:
            continue
        topics: dict[str, list[int]] = {}
        for t, p in tps:
            topics.setdefault(t, []).append(p)
        resp = brokers.conn(brokers.nodes[leader]).call(
            2,
            7,
            {
                "replica_id": -1,
                "isolation_level": 0,
                "topics": [
                    {
                        "name": t,
                        "partitions": [
                            {"partition_index": p, "current_leader_epoch": -1, "timestamp": ts}
                            for p in ps
                        ],
                    }
                    for t, ps in topics.items()
                ],
            },
        )
        for t in resp.topics:
            for p in t.partitions:
                if p.error_code == ErrorCode.none:
                    out[(t.name, p.partition_index)] = p.offset
    return out


def committed(conn: KafkaWire, group: str) -> dict[tuple[str, int], int]:
    resp = conn.call(
        9, 8, {"groups": [{"group_id": group, "topics": None}], "require_stable": False}
    )
    g = resp.groups[0]
    _check(g.error_code, f"fetching the offsets of group '{group}'")
    return {
        (t.name, p.partition_index): p.committed_offset
        for t in g.topics
        for p in t.partitions
        if p.committed_offset >= 0
    }


def _names(parts: Any) -> dict[str, list[int]]:
    return {t.topic_name: sorted(t.partitions) for t in parts.topic_partitions}


def describe_consumer_group(conn: KafkaWire, group: str) -> dict[str, Any] | None:
    """A consumer-protocol (KIP-848) group through ConsumerGroupDescribe, or None if the
    group is not one (or the broker has no such API)."""
    try:
        resp = conn.call(69, 0, {"group_ids": [group], "include_authorized_operations": False})
    except (OSError, ValueError):
        return None
    d = resp.groups[0]
    if ErrorCode(int(getattr(d.error_code, "value", d.error_code))) != ErrorCode.none:
        return None
    members = [
        {
            "member_id": m.member_id,
            "group_instance_id": m.instance_id,
            "client_id": m.client_id,
            "host": m.client_host,
            "assignment": _names(m.assignment),
            "member_epoch": m.member_epoch,
            "target_assignment": _names(m.target_assignment),
            "subscribed_topics": list(m.subscribed_topic_names),
            "subscribed_regex": m.subscribed_topic_regex,
        }
        for m in d.members
    ]
    return {
        "state": d.group_state,
        "protocol_type": "consumer",
        "assignor": d.assignor_name,
        "type": "consumer",
        "group_epoch": d.group_epoch,
        "assignment_epoch": d.assignment_epoch,
        "members": members,
    }


def describe_group(brokers: Brokers, group: str) -> dict[str, Any]:
    conn = brokers.coordinator(group)
    d = conn.call(15, 5, {"groups": [group], "include_authorized_operations": False}).groups[0]
    _check(d.error_code, f"describing group '{group}'")
    kind: dict[str, Any] = {
        "state": d.group_state,
        "protocol_type": d.protocol_type,
        "assignor": d.protocol_data,
        "type": "classic",
    }
    members = []
    if d.group_state == "Dead":  # DescribeGroups knows classic groups only
        found = describe_consumer_group(conn, group)
        if found is None:
            raise GroupCommandError(
                ErrorCode.group_id_not_found, f"Group '{group}' does not exist."
            )
        members = found.pop("members")
        kind = found
    for m in d.members:
        members.append(
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "host": m.client_host,
                "assignment": parse_assignment(bytes(m.member_assignment)),
            }
        )
    owners: dict[tuple[str, int], dict[str, Any]] = {}
    for member in members:
        for t, ps in member["assignment"].items():
            for p in ps:
                owners[(t, p)] = member
    offsets = committed(conn, group)
    tps = sorted(set(offsets) | set(owners))
    ends = list_offsets(brokers, tps, LATEST) if tps else {}
    partitions = []
    for tp in tps:
        current, end = offsets.get(tp), ends.get(tp)
        owner = owners.get(tp)
        partitions.append(
            {
                "topic": tp[0],
                "partition": tp[1],
                "current_offset": current,
                "log_end_offset": end,
                "lag": end - current if current is not None and end is not None else None,
                "consumer_id": owner["member_id"] if owner else None,
                "client_id": owner["client_id"] if owner else None,
            }
        )
    return {"group": group, **kind, "members": members, "partitions": partitions}
