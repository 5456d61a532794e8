"""``kraft topics``: create, list, describe, delete, add partitions to topics and delete records."""

from __future__ import annotations

import argparse
from typing import Any

from kraft.errors import ErrorCode
from tools import output
from tools.commands import delete_records, elect_leaders
from tools.commands.common import (
    ManualFormatter,
    UsageError,
    add_client_options,
    call,
    item_failed,
    parse_key_values,
    positive_int,
    print_item_error,
    print_json,
    report_items,
    show,
)


def parse_replica_assignment(text: str) -> list[list[int]]:
    """``"1:2:3,2:3:1"`` → ``[[1, 2, 3], [2, 3, 1]]`` (one replica list per partition).

    Every partition needs at least one replica, no broker twice in a partition, and all
    partitions the same number of replicas. Raises :class:`UsageError`.
    """
    text = text.strip()
    if not text:
        raise UsageError("--replica-assignment is empty")
    out: list[list[int]] = []
    for pid, part in enumerate(text.split(",")):
        part = part.strip()
        if not part:
            raise UsageError(f"--replica-assignment: partition {pid} has no replicas")
        try:
            replicas = [int(x) for x in part.split(":")]
        except ValueError:
            raise UsageError(
                f"--replica-assignment: partition {pid}: {part!r} is not a "
                "list of broker ids separated by ':'"
            ) from None
        if any(r < 0 for r in replicas):
            raise UsageError(f"--replica-assignment: partition {pid}: negative broker id")
        if len(set(replicas)) != len(replicas):
            raise UsageError(f"--replica-assignment: partition {pid} lists a broker twice ({part})")
        if out and len(replicas) != len(out[0]):
            raise UsageError(
                f"--replica-assignment: partition {pid} has {len(replicas)} "
                f"replicas but partition 0 has {len(out[0])}"
            )
        out.append(replicas)
    return out


# ---- create ---------------------------------------------------------------------------------


def create_body(args: argparse.Namespace) -> dict[str, Any]:
    """The CreateTopics request for ``kraft topics create``."""
    topic: dict[str, Any] = {"name": args.name}
    if args.replica_assignment is not None:
        if args.partitions is not None or args.replication_factor is not None:
            raise UsageError(
                "--replica-assignment cannot be combined with --partitions or "
                "--replication-factor (they follow from the assignment)"
            )
        assignment = parse_replica_assignment(args.replica_assignment)
        topic["num_partitions"] = -1
        topic["replication_factor"] = -1
        topic["assignments"] = {i: replicas for i, replicas in enumerate(assignment)}
    else:
        topic["num_partitions"] = args.partitions if args.partitions is not None else -1
        topic["replication_factor"] = (
            args.replication_factor if args.replication_factor is not None else -1
        )
    configs = parse_key_values(args.config, "--config")
    if configs:
        topic["configs"] = configs
    return {"topics": [topic], "validate_only": bool(args.validate_only)}


def _topic_label(item: dict[str, Any]) -> str:
    return f"topic {item.get('name')}"


def cmd_create(args: argparse.Namespace) -> int:
    resp = call(args, "CreateTopics", create_body(args))
    verb = "Validated creation of" if args.validate_only else "Created"

    def created(item: dict[str, Any]) -> str:
        return (
            f"{verb} topic {item['name']} with {item.get('num_partitions')} partition(s), "
            f"replication factor {item.get('replication_factor')}"
            + (f", id {item['topic_id']}." if item.get("topic_id") else ".")
        )

    tolerated = (
        (ErrorCode.TOPIC_ALREADY_EXISTS, lambda item: f"Topic {item['name']} already exists.")
        if args.if_not_exists
        else None
    )
    return report_items(args, resp, "topics", _topic_label, created, tolerated)


# ---- list -----------------------------------------------------------------------------------


def render_list(resp: dict[str, Any]) -> str:
    """Table of topics sorted by name."""
    topics = sorted(resp.get("topics", []), key=lambda t: t["name"])
    if not topics:
        return "No topics."
    return output.render_table(
        ("NAME", "TOPIC ID", "PARTITIONS"),
        [(t["name"], t.get("topic_id"), t.get("partitions")) for t in topics],
    )


def cmd_list(args: argparse.Namespace) -> int:
    return show(args, call(args, "ListTopics", {}), render_list)


# ---- describe -------------------------------------------------------------------------------


def _leader(value: Any) -> Any:
    return "none" if value is None or value == -1 else value


def render_describe(topics: list[dict[str, Any]]) -> str:
    """Per topic: a summary line, then one row per partition (leader, epoch, replicas, ISR)."""
    blocks = []
    for t in sorted(topics, key=lambda t: t["name"]):
        if item_failed(t):
            continue
        parts = sorted(t.get("partitions", []), key=lambda p: p["partition"])
        rf = len(parts[0]["replicas"]) if parts else 0
        configs = t.get("configs") or {}
        head = (
            f"Topic: {t['name']}  TopicId: {t.get('topic_id')}  PartitionCount: {len(parts)}"
            f"  ReplicationFactor: {rf}  Configs: {output.cell(dict(sorted(configs.items())))}"
        )
        rows = []
        for p in parts:
            extra = []
            if p.get("adding_replicas"):
                extra.append("adding=" + output.cell(p["adding_replicas"]))
            if p.get("removing_replicas"):
                extra.append("removing=" + output.cell(p["removing_replicas"]))
            if p.get("leader_recovery_state"):
                extra.append("recovering")
            rows.append(
                (
                    p["partition"],
                    _leader(p.get("leader")),
                    p.get("leader_epoch"),
                    p.get("replicas"),
                    p.get("isr"),
                    " ".join(extra) or None,
                )
            )
        table = output.render_table(
            ("PARTITION", "LEADER", "LEADER EPOCH", "REPLICAS", "ISR", "NOTES"), rows, indent="  "
        )
        blocks.append(head + "\n" + table)
    return "\n\n".join(blocks)


def cmd_describe(args: argparse.Namespace) -> int:
    resp = call(args, "DescribeTopics", {"names": list(args.names) if args.names else None})
    topics = resp.get("topics", [])
    failed = [t for t in topics if item_failed(t)]
    if args.json:
        print_json({**resp, "topics": output.annotate_errors(topics)})
    else:
        text = render_describe(topics)
        if text:
            print(text)
        elif not failed:
            print("No topics.")
        for t in failed:
            print_item_error(f"topic {t.get('name')}", t)
    return output.EXIT_ERROR if failed else output.EXIT_OK


# ---- delete ---------------------------------------------------------------------------------


def cmd_delete(args: argparse.Namespace) -> int:
    resp = call(args, "DeleteTopics", {"names": list(args.names)})
    tolerated = (
        (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, lambda item: f"Topic {item['name']} does not exist.")
        if args.if_exists
        else None
    )
    return report_items(
        args, resp, "topics", _topic_label, lambda item: f"Deleted topic {item['name']}.", tolerated
    )


# ---- add-partitions -------------------------------------------------------------------------


def add_partitions_body(args: argparse.Namespace) -> dict[str, Any]:
    """The CreatePartitions request for ``kraft topics add-partitions``."""
    topic: dict[str, Any] = {"name": args.name, "count": args.partitions}
    if args.replica_assignment is not None:
        topic["assignments"] = parse_replica_assignment(args.replica_assignment)
    return {"topics": [topic], "validate_only": bool(args.validate_only)}


def cmd_add_partitions(args: argparse.Namespace) -> int:
    resp = call(args, "CreatePartitions", add_partitions_body(args))
    verb = "Validated" if args.validate_only else "Done:"
    return report_items(
        args,
        resp,
        "topics",
        _topic_label,
        lambda item: f"{verb} topic {item['name']} now has {args.partitions} partition(s).",
    )


# ---- parser ---------------------------------------------------------------------------------


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``kraft topics ...`` to the top-level parser."""
    p = sub.add_parser(
        "topics",
        help="create, list, describe and delete topics",
        formatter_class=ManualFormatter,
        description="Manage topics through the controller quorum. Writes go to the active "
        "controller (any controller endpoint will do); reads are answered by the "
        "controller you reach, from its replica of the metadata log.",
        epilog="examples:\n"
        "  kraft topics create orders --partitions 6 --replication-factor 3 --cluster ./c\n"
        "  kraft topics list --bootstrap-controller 127.0.0.1:9093\n"
        "  kraft topics describe orders --cluster ./c\n"
        "  kraft topics delete orders payments --if-exists --cluster ./c",
    )
    tsub = p.add_subparsers(dest="topics_command", metavar="COMMAND", required=True)

    c = tsub.add_parser(
        "create",
        help="create a topic",
        formatter_class=ManualFormatter,
        description="Create a topic. Without --partitions/--replication-factor the controller "
        "uses num.partitions and default.replication.factor. --replica-assignment "
        "places each partition explicitly instead: partitions are separated by ',' "
        "and the broker ids of one partition by ':' (the first is the preferred "
        "leader).",
        epilog="examples:\n"
        "  kraft topics create orders --partitions 6 --replication-factor 3 --cluster ./c\n"
        "  kraft topics create audit --replica-assignment 101:102,102:103 \\\n"
        "      --config cleanup.policy=compact --config retention.ms=-1 --cluster ./c\n"
        "  kraft topics create orders --partitions 6 --validate-only --cluster ./c\n\n"
        "exit status: 0 created (or existed, with --if-not-exists), 1 refused by the "
        "controller, 2 bad arguments",
    )
    c.add_argument("name", metavar="NAME", help="topic name")
    c.add_argument("--partitions", type=positive_int, metavar="N", help="number of partitions")
    c.add_argument(
        "--replication-factor", type=positive_int, metavar="R", help="replicas per partition"
    )
    c.add_argument(
        "--config",
        action="append",
        metavar="KEY=VALUE",
        help="a topic config override (repeatable)",
    )
    c.add_argument(
        "--replica-assignment", metavar="ASSIGNMENT", help='explicit placement, e.g. "1:2:3,2:3:1"'
    )
    c.add_argument(
        "--validate-only", action="store_true", help="check the request without creating anything"
    )
    c.add_argument(
        "--if-not-exists", action="store_true", help="succeed when the topic already exists"
    )
    add_client_options(c)
    c.set_defaults(handler=cmd_create)

    ls = tsub.add_parser(
        "list",
        help="list topic names",
        formatter_class=ManualFormatter,
        description="List every topic with its id and partition count.",
        epilog="example:\n  kraft topics list --cluster ./c --json",
    )
    add_client_options(ls)
    ls.set_defaults(handler=cmd_list)

    d = tsub.add_parser(
        "describe",
        help="show partitions, leaders, replicas and ISR",
        formatter_class=ManualFormatter,
        description="Describe topics (all of them when no NAME is given): per partition the "
        "leader ('none' when offline), leader epoch, replicas and in-sync replicas.",
        epilog="examples:\n  kraft topics describe --cluster ./c\n"
        "  kraft topics describe orders payments --json --cluster ./c",
    )
    d.add_argument("names", nargs="*", metavar="NAME", help="topics to describe (default: all)")
    add_client_options(d)
    d.set_defaults(handler=cmd_describe)

    rm = tsub.add_parser(
        "delete",
        help="delete topics",
        formatter_class=ManualFormatter,
        description="Delete one or more topics. Each topic succeeds or fails on its own; the "
        "exit status is 1 if any failed.",
        epilog="example:\n  kraft topics delete orders payments --if-exists --cluster ./c",
    )
    rm.add_argument("names", nargs="+", metavar="NAME", help="topics to delete")
    rm.add_argument("--if-exists", action="store_true", help="succeed for topics that do not exist")
    add_client_options(rm)
    rm.set_defaults(handler=cmd_delete)

    delete_records.register(tsub)

    ap = tsub.add_parser(
        "add-partitions",
        help="raise a topic's partition count",
        formatter_class=ManualFormatter,
        description="Grow a topic to N partitions in total (partitions are never removed). "
        "--replica-assignment optionally places the new partitions only.",
        epilog="examples:\n  kraft topics add-partitions orders --partitions 12 --cluster ./c\n"
        "  kraft topics add-partitions audit --partitions 3 --replica-assignment 103:101 "
        "--cluster ./c",
    )
    ap.add_argument("name", metavar="NAME", help="topic name")
    ap.add_argument(
        "--partitions",
        type=positive_int,
        metavar="N",
        required=True,
        help="the new total number of partitions",
    )
    ap.add_argument(
        "--replica-assignment",
        metavar="ASSIGNMENT",
        help='placement of the new partitions, e.g. "1:2,2:3"',
    )
    ap.add_argument(
        "--validate-only", action="store_true", help="check the request without changing anything"
    )
    add_client_options(ap)
    ap.set_defaults(handler=cmd_add_partitions)

    elect_leaders.register(tsub)


__all__ = [
    "add_partitions_body",
    "create_body",
    "parse_replica_assignment",
    "register",
    "render_describe",
    "render_list",
]
