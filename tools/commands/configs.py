"""``kraft configs describe|alter``: topic and broker configuration (dynamic overrides)."""

from __future__ import annotations

import argparse
from typing import Any

from tools import output
from tools.commands.common import (
    ManualFormatter,
    UsageError,
    add_client_options,
    call,
    parse_key_values,
    report_items,
)

# Kafka addresses cluster-wide broker defaults as the broker resource with an empty name.
BROKER_DEFAULTS_NAME = ""


def resource_of(args: argparse.Namespace) -> tuple[str, str]:
    """``(resource_type, resource_name)`` from --topic / --broker / --broker-defaults."""
    if args.topic is not None:
        if not args.topic:
            raise UsageError("--topic needs a topic name")
        return "topic", args.topic
    if args.broker is not None:
        return "broker", str(args.broker)
    return "broker", BROKER_DEFAULTS_NAME


def resource_label(resource_type: str, name: str) -> str:
    """``topic orders``, ``broker 101`` or ``broker defaults``."""
    if resource_type == "broker" and name == BROKER_DEFAULTS_NAME:
        return "broker defaults"
    return f"{resource_type} {name}"


def render_configs(resource: dict[str, Any]) -> str:
    """Config table for one DescribeConfigs resource."""
    rows = []
    for c in sorted(resource.get("configs", []), key=lambda c: c["name"]):
        value = "(sensitive)" if c.get("sensitive") else c.get("value")
        flags = "read-only" if c.get("read_only") else None
        rows.append((c["name"], value, c.get("source"), flags))
    label = resource_label(resource["resource_type"], resource["resource_name"])
    if not rows:
        return f"Configs for {label}: none set."
    return f"Configs for {label}:\n" + output.render_table(
        ("NAME", "VALUE", "SOURCE", "NOTES"), rows, indent="  "
    )


def _resource_label(item: dict[str, Any]) -> str:
    return resource_label(item["resource_type"], item["resource_name"])


def cmd_describe(args: argparse.Namespace) -> int:
    rtype, rname = resource_of(args)
    resp = call(
        args, "DescribeConfigs", {"resources": [{"resource_type": rtype, "resource_name": rname}]}
    )
    return report_items(args, resp, "resources", _resource_label, render_configs)


def alter_ops(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The IncrementalAlterConfigs ops from --set/--delete/--append/--subtract."""
    ops: list[dict[str, Any]] = []
    for key, value in parse_key_values(args.set, "--set").items():
        ops.append({"name": key, "op": "SET", "value": value})
    for key, value in parse_key_values(args.append, "--append").items():
        ops.append({"name": key, "op": "APPEND", "value": value})
    for key, value in parse_key_values(args.subtract, "--subtract").items():
        ops.append({"name": key, "op": "SUBTRACT", "value": value})
    for key in args.delete or ():
        key = key.strip()
        if not key or "=" in key:
            raise UsageError(f"--delete expects a config name, got {key!r}")
        ops.append({"name": key, "op": "DELETE"})
    names = [op["name"] for op in ops]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UsageError(f"config(s) changed twice in one command: {', '.join(dupes)}")
    if not ops:
        raise UsageError("nothing to change: give --set KEY=VALUE and/or --delete KEY")
    return ops


def alter_body(args: argparse.Namespace) -> dict[str, Any]:
    rtype, rname = resource_of(args)
    return {
        "resources": [{"resource_type": rtype, "resource_name": rname, "ops": alter_ops(args)}],
        "validate_only": bool(args.validate_only),
    }


def cmd_alter(args: argparse.Namespace) -> int:
    resp = call(args, "IncrementalAlterConfigs", alter_body(args))
    verb = "Validated changes to" if args.validate_only else "Updated"
    return report_items(
        args,
        resp,
        "resources",
        _resource_label,
        lambda item: f"{verb} configs of {_resource_label(item)}.",
    )


def _add_target(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("resource (choose one)").add_mutually_exclusive_group(required=True)
    g.add_argument("--topic", metavar="NAME", help="a topic")
    g.add_argument("--broker", type=int, metavar="ID", help="one broker's overrides")
    g.add_argument(
        "--broker-defaults", action="store_true", help="the cluster-wide broker defaults"
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``kraft configs ...``."""
    p = sub.add_parser(
        "configs",
        help="describe and alter topic/broker configs",
        formatter_class=ManualFormatter,
        description="Read and change dynamic configuration stored in the metadata log: topic "
        "overrides, per-broker overrides and cluster-wide broker defaults.",
    )
    csub = p.add_subparsers(dest="configs_command", metavar="COMMAND", required=True)

    d = csub.add_parser(
        "describe",
        help="show a resource's configs",
        formatter_class=ManualFormatter,
        description="Show the configs of a topic, a broker or the broker defaults: name, value, "
        "source (dynamic = set in the metadata log, default = built in).",
        epilog="examples:\n  kraft configs describe --topic orders --cluster ./c\n"
        "  kraft configs describe --broker 101 --cluster ./c --json\n"
        "  kraft configs describe --broker-defaults --cluster ./c",
    )
    _add_target(d)
    add_client_options(d)
    d.set_defaults(handler=cmd_describe)

    a = csub.add_parser(
        "alter",
        help="set or delete configs",
        formatter_class=ManualFormatter,
        description="Change configs incrementally: --set adds or replaces a value, --delete "
        "removes an override (the default applies again), --append/--subtract "
        "edit list-valued configs. All changes of one command apply together or "
        "not at all.",
        epilog="examples:\n"
        "  kraft configs alter --topic orders --set retention.ms=86400000 "
        "--set cleanup.policy=delete --cluster ./c\n"
        "  kraft configs alter --topic orders --delete retention.ms --cluster ./c\n"
        "  kraft configs alter --broker-defaults --set min.insync.replicas=2 --cluster ./c",
    )
    _add_target(a)
    a.add_argument("--set", action="append", metavar="KEY=VALUE", help="set a config (repeatable)")
    a.add_argument(
        "--delete", action="append", metavar="KEY", help="remove a config override (repeatable)"
    )
    a.add_argument(
        "--append",
        action="append",
        metavar="KEY=VALUE",
        help="append to a list config (repeatable)",
    )
    a.add_argument(
        "--subtract",
        action="append",
        metavar="KEY=VALUE",
        help="remove from a list config (repeatable)",
    )
    a.add_argument(
        "--validate-only", action="store_true", help="check the changes without applying them"
    )
    add_client_options(a)
    a.set_defaults(handler=cmd_alter)
