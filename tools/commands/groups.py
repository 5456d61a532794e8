"""``kraft groups``: consumer groups, in the shape of Kafka's kafka-consumer-groups.sh.

``list``, ``describe GROUP`` (state, members, and per partition the committed offset, log-end
offset, lag and owner), ``delete GROUP`` and ``reset-offsets GROUP --topic T --to-...``
(a plan, committed only with ``--execute``, and only while the group has no members). These
talk to brokers with the Kafka protocol (:mod:`tools.kafka_wire`): FindCoordinator, then the
group APIs on the coordinator; ListOffsets on partition leaders for log-end offsets.
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from tools import output
from tools.commands.common import (
    CLUSTER_DIR_ENV,
    ManualFormatter,
    UsageError,
    parse_endpoints,
    positive_float,
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


def _bootstrap(args: argparse.Namespace) -> list[tuple[str, int]]:
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


def describe_group(brokers: Brokers, group: str) -> dict[str, Any]:
    conn = brokers.coordinator(group)
    d = conn.call(15, 5, {"groups": [group], "include_authorized_operations": False}).groups[0]
    _check(d.error_code, f"describing group '{group}'")
    if d.group_state == "Dead":
        raise GroupCommandError(ErrorCode.group_id_not_found, f"Group '{group}' does not exist.")
    owners: dict[tuple[str, int], dict[str, Any]] = {}
    members = []
    for m in d.members:
        assigned = parse_assignment(bytes(m.member_assignment))
        members.append(
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "host": m.client_host,
                "assignment": assigned,
            }
        )
        for t, ps in assigned.items():
            for p in ps:
                owners[(t, p)] = members[-1]
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
    return {
        "group": group,
        "state": d.group_state,
        "protocol_type": d.protocol_type,
        "assignor": d.protocol_data,
        "members": members,
        "partitions": partitions,
    }


# ---- commands --------------------------------------------------------------------------------


def _run(args: argparse.Namespace, fn: Any) -> int:
    brokers = Brokers(_bootstrap(args), args.timeout)
    try:
        return int(fn(brokers))
    except GroupCommandError as e:
        _report(e.code, str(e), args.json)
        return output.EXIT_ERROR
    except OSError as e:
        _report(ErrorCode.network_exception, f"talking to the brokers: {e}", args.json)
        return output.EXIT_ERROR
    finally:
        brokers.close()


def _report(code: ErrorCode, message: str, as_json: bool) -> None:
    name = code.name.upper()
    if as_json:
        print(output.to_json({"error": name, "error_code": code.value, "message": message}))
    print(f"Error: {name}: {message}", file=sys.stderr)


def cmd_list(args: argparse.Namespace) -> int:
    def run(brokers: Brokers) -> int:
        brokers.metadata([])
        groups: dict[str, dict[str, Any]] = {}
        for address in brokers.nodes.values():
            resp = brokers.conn(address).call(16, 4, {"states_filter": []})
            _check(resp.error_code, f"listing groups on {address[0]}:{address[1]}")
            for g in resp.groups:
                groups[g.group_id] = {
                    "group": g.group_id,
                    "state": g.group_state,
                    "protocol_type": g.protocol_type,
                }
        rows = [groups[k] for k in sorted(groups)]
        if args.json:
            print(output.to_json(rows))
        elif rows:
            print(
                output.render_table(
                    ["GROUP", "STATE", "PROTOCOL-TYPE"],
                    [[r["group"], r["state"], r["protocol_type"] or "-"] for r in rows],
                )
            )
        return output.EXIT_OK

    return _run(args, run)


def render_describe(d: dict[str, Any]) -> str:
    head = f"Group {d['group']}: {d['state']}, {len(d['members'])} member(s)" + (
        f", assignor {d['assignor']}" if d["assignor"] else ""
    )
    rows = [
        [
            d["group"],
            p["topic"],
            p["partition"],
            p["current_offset"],
            p["log_end_offset"],
            p["lag"],
            p["consumer_id"],
            p["client_id"],
        ]
        for p in d["partitions"]
    ]
    table = output.render_table(
        [
            "GROUP",
            "TOPIC",
            "PARTITION",
            "CURRENT-OFFSET",
            "LOG-END-OFFSET",
            "LAG",
            "CONSUMER-ID",
            "CLIENT-ID",
        ],
        rows,
    )
    return head + ("\n\n" + table if rows else "")


def cmd_describe(args: argparse.Namespace) -> int:
    def run(brokers: Brokers) -> int:
        d = describe_group(brokers, args.group)
        print(output.to_json(d) if args.json else render_describe(d))
        return output.EXIT_OK

    return _run(args, run)


def cmd_delete(args: argparse.Namespace) -> int:
    def run(brokers: Brokers) -> int:
        conn = brokers.coordinator(args.group)
        r = conn.call(42, 2, {"groups_names": [args.group]}).results[0]
        code = ErrorCode(int(r.error_code.value))
        if code != ErrorCode.none:
            why = {
                ErrorCode.non_empty_group: "The group has active members.",
                ErrorCode.group_id_not_found: "The group does not exist.",
            }.get(code, "")
            raise GroupCommandError(code, f"Deleting group '{args.group}' failed. {why}".strip())
        if args.json:
            print(output.to_json({"group": args.group, "deleted": True}))
        else:
            print(f"Deleted group '{args.group}'.")
        return output.EXIT_OK

    return _run(args, run)


def parse_datetime_ms(text: str) -> int:
    """ISO 8601 (naive = UTC) or epoch milliseconds -> epoch milliseconds."""
    if text.isdigit():
        return int(text)
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"--to-datetime {text!r}: expected ISO 8601 (2024-01-31T12:00:00) or epoch ms"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


def cmd_reset_offsets(args: argparse.Namespace) -> int:
    def run(brokers: Brokers) -> int:
        meta = brokers.metadata([args.topic])
        topic = meta.topics[0]
        _check(topic.error_code, f"topic '{args.topic}'")
        tps = [(args.topic, p.partition_index) for p in topic.partitions]
        conn = brokers.coordinator(args.group)
        d = conn.call(15, 5, {"groups": [args.group], "include_authorized_operations": False})
        state = d.groups[0].group_state
        if state not in ("Empty", "Dead"):
            raise GroupCommandError(
                ErrorCode.non_empty_group,
                f"Assignments can only be reset if the group '{args.group}' is inactive, but "
                f"the current state is {state}.",
            )
        earliest = list_offsets(brokers, tps, EARLIEST)
        latest = list_offsets(brokers, tps, LATEST)
        if args.to_earliest:
            target = earliest
        elif args.to_latest:
            target = latest
        elif args.to_datetime is not None:
            found = list_offsets(brokers, tps, parse_datetime_ms(args.to_datetime))
            target = {tp: found.get(tp, latest.get(tp, 0)) for tp in tps}
        else:
            target = {
                tp: min(max(args.to_offset, earliest.get(tp, 0)), latest.get(tp, 0)) for tp in tps
            }
        plan = [
            {"group": args.group, "topic": t, "partition": p, "new_offset": target.get((t, p))}
            for t, p in tps
        ]
        if args.execute:
            resp = conn.call(
                8,
                8,
                {
                    "group_id": args.group,
                    "generation_id_or_member_epoch": -1,
                    "member_id": "",
                    "group_instance_id": None,
                    "topics": [
                        {
                            "name": args.topic,
                            "partitions": [
                                {
                                    "partition_index": r["partition"],
                                    "committed_offset": r["new_offset"],
                                    "committed_leader_epoch": -1,
                                    "committed_metadata": "",
                                }
                                for r in plan
                                if r["new_offset"] is not None
                            ],
                        }
                    ],
                },
            )
            for t in resp.topics:
                for p in t.partitions:
                    _check(p.error_code, f"committing {t.name}-{p.partition_index}")
        if args.json:
            print(output.to_json({"executed": bool(args.execute), "offsets": plan}))
        else:
            print(
                output.render_table(
                    ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"],
                    [[r["group"], r["topic"], r["partition"], r["new_offset"]] for r in plan],
                )
            )
            if not args.execute:
                print("\n(dry run: nothing committed; add --execute to commit these offsets)")
        return output.EXIT_OK

    return _run(args, run)


def _options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("connection and output")
    where = g.add_mutually_exclusive_group()
    where.add_argument(
        "--bootstrap-server",
        metavar="HOST:PORT[,HOST:PORT]",
        help=f"Kafka listener(s) of any broker (env {BOOTSTRAP_SERVER_ENV})",
    )
    where.add_argument(
        "--cluster",
        metavar="DIR",
        help=f"a directory made by 'kraft cluster up'; its brokers are used (env {CLUSTER_DIR_ENV})",
    )
    g.add_argument(
        "--timeout", type=positive_float, default=10.0, metavar="S", help="per request (default 10)"
    )
    g.add_argument("--json", action="store_true", help="print JSON")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "groups",
        help="list, describe, delete consumer groups; reset their offsets",
        formatter_class=ManualFormatter,
        description="Consumer groups, as Kafka's kafka-consumer-groups.sh shows them. These "
        "commands talk to the brokers' Kafka listeners (not the controllers).",
        epilog="examples:\n"
        "  kraft groups list --cluster ./c\n"
        "  kraft groups describe orders-app --cluster ./c\n"
        "  kraft groups reset-offsets orders-app --topic orders --to-earliest --cluster ./c\n"
        "  kraft groups reset-offsets orders-app --topic orders --to-offset 42 --execute "
        "--cluster ./c\n"
        "  kraft groups delete orders-app --cluster ./c",
    )
    gsub = p.add_subparsers(dest="groups_command", metavar="SUBCOMMAND", required=True)
    ls = gsub.add_parser("list", help="every group the brokers coordinate")
    _options(ls)
    ls.set_defaults(handler=cmd_list)
    d = gsub.add_parser(
        "describe",
        help="state, members, committed offsets, log-end offsets and lag",
        formatter_class=ManualFormatter,
    )
    d.add_argument("group", metavar="GROUP")
    _options(d)
    d.set_defaults(handler=cmd_describe)
    rm = gsub.add_parser("delete", help="delete an empty group and its offsets")
    rm.add_argument("group", metavar="GROUP")
    _options(rm)
    rm.set_defaults(handler=cmd_delete)
    r = gsub.add_parser(
        "reset-offsets",
        help="move an inactive group's committed offsets of a topic",
        formatter_class=ManualFormatter,
        description="Show (dry run) or, with --execute, commit new offsets for every partition "
        "of TOPIC. The group must have no members, as in Kafka.",
    )
    r.add_argument("group", metavar="GROUP")
    r.add_argument("--topic", required=True, metavar="TOPIC")
    to = r.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="the log start offsets")
    to.add_argument("--to-latest", action="store_true", help="the log end offsets")
    to.add_argument("--to-offset", type=int, metavar="N", help="offset N (clamped to the log)")
    to.add_argument(
        "--to-datetime", metavar="TS", help="first offset at or after TS (ISO 8601 or epoch ms)"
    )
    r.add_argument("--execute", action="store_true", help="commit the offsets (default: dry run)")
    _options(r)
    r.set_defaults(handler=cmd_reset_offsets)
