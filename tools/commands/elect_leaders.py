"""``kraft topics elect-leaders``: preferred or unclean leader elections from the command line.

The shape of Kafka's ``kafka-leader-election.sh``: an election type, and either named partitions
(``--topic`` with optional ``--partition``) or every partition. Over every partition the active
controller elects at most one batch of leaders per request, so the command asks again until a
pass elects nothing new, and reports each partition once.
"""

from __future__ import annotations

import argparse
from typing import Any

from kraft.errors import ErrorCode
from tools import output
from tools.commands.common import (
    ManualFormatter,
    UsageError,
    add_client_options,
    call,
    print_item_error,
    print_json,
)

#: how many passes over every partition before giving up (each elects up to one batch)
MAX_PASSES = 1000


def _partitions(args: argparse.Namespace) -> list[dict[str, Any]] | dict[str, Any] | None:
    """The partitions named on the command line, None for every partition, or the failed
    describe result of an unknown ``--topic``."""
    if args.topic is None:
        if args.partition is not None:
            raise UsageError("--partition needs --topic")
        return None
    if args.partition is not None:
        return [{"topic": args.topic, "partition": args.partition}]
    resp = call(args, "DescribeTopics", {"names": [args.topic]})
    topics = resp.get("topics", [])
    if not topics or topics[0].get("error_code"):
        failed = topics[0] if topics else {"error_code": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
        return {"topic": args.topic, "partition": -1, "leader": -1, **failed}
    return [
        {"topic": args.topic, "partition": p["partition"]}
        for p in sorted(topics[0].get("partitions", []), key=lambda p: p["partition"])
    ]


def elect(args: argparse.Namespace, election_type: str) -> list[dict[str, Any]]:
    """Run the elections; one result per partition, in the order the controller reported them."""
    listed = _partitions(args)
    if isinstance(listed, dict):
        return [listed]
    body = {"election_type": election_type, "partitions": listed}
    if listed is not None:
        return list(call(args, "ElectLeaders", body).get("partitions", []))
    results: dict[tuple[str, int], dict[str, Any]] = {}
    for _ in range(MAX_PASSES):
        fresh = 0
        for item in call(args, "ElectLeaders", body).get("partitions", []):
            key = (item.get("topic", ""), item.get("partition", -1))
            if key not in results or (results[key].get("error_code") and not item["error_code"]):
                fresh += not item.get("error_code")
                results[key] = item
        if not fresh:
            break
    return list(results.values())


def _failed(item: dict[str, Any]) -> bool:
    """A partition that needed no election is not a failure (as kafka-leader-election.sh)."""
    return bool(item.get("error_code")) and item["error_code"] != ErrorCode.ELECTION_NOT_NEEDED


def cmd_elect_leaders(args: argparse.Namespace) -> int:
    election_type = args.type.lower()
    results = elect(args, election_type)
    failed = [r for r in results if _failed(r)]
    if args.json:
        print_json({"election_type": election_type, "partitions": output.annotate_errors(results)})
        return output.EXIT_ERROR if failed else output.EXIT_OK
    for r in results:
        label = f"{r.get('topic')}-{r.get('partition')}"
        if _failed(r):
            print_item_error(label, r)
        elif r.get("error_code"):
            print(r.get("error_message") or f"{label} needs no {election_type} election.")
        else:
            print(f"Elected {r.get('leader')} as the leader of {label} ({election_type}).")
    if not results:
        print(f"No partition needed a {election_type} election.")
    return output.EXIT_ERROR if failed else output.EXIT_OK


def register(tsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``kraft topics elect-leaders`` under ``kraft topics``."""
    e = tsub.add_parser(
        "elect-leaders",
        help="move leadership back to preferred replicas (or elect unclean leaders)",
        formatter_class=ManualFormatter,
        description="Run leader elections, like kafka-leader-election.sh. 'preferred' gives "
        "each partition back to its first replica when that replica is alive and in the ISR "
        "(after a broker restart, leadership stays where failover put it until this runs). "
        "'unclean' elects any live replica of a partition that has no leader, and may lose "
        "acknowledged records. Without --topic every partition is considered and only "
        "partitions that changed or could not be elected are reported.",
        epilog="examples:\n"
        "  kraft topics elect-leaders --cluster ./c\n"
        "  kraft topics elect-leaders --topic orders --partition 3 --cluster ./c\n"
        "  kraft topics elect-leaders --type unclean --topic orders --json --cluster ./c\n\n"
        "exit status: 0 every election succeeded or none was needed, 1 some partition "
        "could not be elected (PREFERRED_LEADER_NOT_AVAILABLE, UNKNOWN_TOPIC_OR_PARTITION, "
        "...), "
        "2 bad arguments",
    )
    e.add_argument(
        "--type",
        "--election-type",
        choices=("preferred", "unclean", "PREFERRED", "UNCLEAN"),
        default="preferred",
        help="election type (default: preferred)",
    )
    e.add_argument("--topic", metavar="NAME", help="only this topic's partitions")
    e.add_argument("--partition", type=int, metavar="P", help="only this partition (with --topic)")
    add_client_options(e)
    e.set_defaults(handler=cmd_elect_leaders)
