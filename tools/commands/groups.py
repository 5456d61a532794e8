"""``kraft groups``: consumer groups, in the shape of Kafka's kafka-consumer-groups.sh.

``list``, ``describe GROUP`` (state, members, and per partition the committed offset, log-end
offset, lag and owner), ``delete GROUP`` and ``reset-offsets GROUP --topic T --to-...``
(a plan, committed only with ``--execute``, and only while the group has no members). These
talk to brokers with the Kafka protocol (:mod:`tools.group_admin`, :mod:`tools.kafka_wire`):
FindCoordinator, then the group APIs on the coordinator; ListOffsets on partition leaders.
kio is imported only when one of these commands runs (it costs every other command ~1 s).
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Any

from tools import output
from tools.commands.common import CLUSTER_DIR_ENV, ManualFormatter, UsageError, positive_float

BOOTSTRAP_SERVER_ENV = "KRAFT_BOOTSTRAP_SERVER"


def _admin() -> Any:
    """:mod:`tools.group_admin` (kio), imported only when a command needs it."""
    import tools.group_admin as admin

    return admin


# ---- commands --------------------------------------------------------------------------------


def run_with_brokers(args: argparse.Namespace, fn: Any) -> int:
    a = _admin()
    brokers = a.Brokers(a.bootstrap(args), args.timeout)
    try:
        return int(fn(brokers))
    except a.GroupCommandError as e:
        _report(e.code, str(e), args.json)
        return output.EXIT_ERROR
    except OSError as e:
        _report(a.ErrorCode.network_exception, f"talking to the brokers: {e}", args.json)
        return output.EXIT_ERROR
    finally:
        brokers.close()


def _report(code: Any, message: str, as_json: bool) -> None:
    name = code.name.upper()
    if as_json:
        print(output.to_json({"error": name, "error_code": code.value, "message": message}))
    print(f"Error: {name}: {message}", file=sys.stderr)


def cmd_list(args: argparse.Namespace) -> int:
    a = _admin()

    def run(brokers: Any) -> int:
        brokers.metadata([])
        groups: dict[str, dict[str, Any]] = {}
        for address in brokers.nodes.values():
            resp = brokers.conn(address).call(16, 5, {"states_filter": [], "types_filter": []})
            a._check(resp.error_code, f"listing groups on {address[0]}:{address[1]}")
            for g in resp.groups:
                groups[g.group_id] = {
                    "group": g.group_id,
                    "state": g.group_state,
                    "protocol_type": g.protocol_type,
                    "type": g.group_type or "classic",
                }
        rows = [groups[k] for k in sorted(groups)]
        if args.json:
            print(output.to_json(rows))
        elif rows:
            print(
                output.render_table(
                    ["GROUP", "STATE", "PROTOCOL-TYPE", "TYPE"],
                    [[r["group"], r["state"], r["protocol_type"] or "-", r["type"]] for r in rows],
                )
            )
        return output.EXIT_OK

    return run_with_brokers(args, run)


def render_describe(d: dict[str, Any]) -> str:
    head = f"Group {d['group']}: {d['state']}, {len(d['members'])} member(s)" + (
        f", assignor {d['assignor']}" if d["assignor"] else ""
    )
    if d.get("type") == "consumer":
        head += (
            f" (consumer protocol, group epoch {d['group_epoch']}, "
            f"assignment epoch {d['assignment_epoch']})"
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
    a = _admin()

    def run(brokers: Any) -> int:
        d = a.describe_group(brokers, args.group)
        print(output.to_json(d) if args.json else render_describe(d))
        return output.EXIT_OK

    return run_with_brokers(args, run)


def cmd_delete(args: argparse.Namespace) -> int:
    a = _admin()

    def run(brokers: Any) -> int:
        conn = brokers.coordinator(args.group)
        r = conn.call(42, 2, {"groups_names": [args.group]}).results[0]
        code = a.ErrorCode(int(r.error_code.value))
        if code != a.ErrorCode.none:
            why = {
                a.ErrorCode.non_empty_group: "The group has active members.",
                a.ErrorCode.group_id_not_found: "The group does not exist.",
            }.get(code, "")
            raise a.GroupCommandError(code, f"Deleting group '{args.group}' failed. {why}".strip())
        if args.json:
            print(output.to_json({"group": args.group, "deleted": True}))
        else:
            print(f"Deleted group '{args.group}'.")
        return output.EXIT_OK

    return run_with_brokers(args, run)


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
    a = _admin()

    def run(brokers: Any) -> int:
        meta = brokers.metadata([args.topic])
        topic = meta.topics[0]
        a._check(topic.error_code, f"topic '{args.topic}'")
        tps = [(args.topic, p.partition_index) for p in topic.partitions]
        conn = brokers.coordinator(args.group)
        d = conn.call(15, 5, {"groups": [args.group], "include_authorized_operations": False})
        state = d.groups[0].group_state
        if state == "Dead":  # maybe a consumer-protocol group, which DescribeGroups does not know
            state = (a.describe_consumer_group(conn, args.group) or {"state": state})["state"]
        if state not in ("Empty", "Dead"):
            raise a.GroupCommandError(
                a.ErrorCode.non_empty_group,
                f"Assignments can only be reset if the group '{args.group}' is inactive, but "
                f"the current state is {state}.",
            )
        earliest = a.list_offsets(brokers, tps, a.EARLIEST)
        latest = a.list_offsets(brokers, tps, a.LATEST)
        if args.to_earliest:
            target = earliest
        elif args.to_latest:
            target = latest
        elif args.to_datetime is not None:
            found = a.list_offsets(brokers, tps, parse_datetime_ms(args.to_datetime))
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
                    a._check(p.error_code, f"committing {t.name}-{p.partition_index}")
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

    return run_with_brokers(args, run)


def broker_options(p: argparse.ArgumentParser) -> None:
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


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    broker_options(ls)
    ls.set_defaults(handler=cmd_list)
    d = gsub.add_parser(
        "describe",
        help="state, members, committed offsets, log-end offsets and lag",
        formatter_class=ManualFormatter,
    )
    d.add_argument("group", metavar="GROUP")
    broker_options(d)
    d.set_defaults(handler=cmd_describe)
    rm = gsub.add_parser("delete", help="delete an empty group and its offsets")
    rm.add_argument("group", metavar="GROUP")
    broker_options(rm)
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
    broker_options(r)
    r.set_defaults(handler=cmd_reset_offsets)
