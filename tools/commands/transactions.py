"""``kraft transactions``: transactional producers, in the shape of Kafka's
kafka-transactions.sh.

``list`` asks every broker's transaction coordinator (ListTransactions) and merges the answers,
optionally filtered by state, producer id or "open longer than"; ``describe --transactional-id
ID`` finds the id's coordinator (FindCoordinator, key type 1) and shows its producer id and
epoch, state, timeout, start time, how long it has been open, and the partitions in it
(DescribeTransactions). Both speak the Kafka protocol to the brokers' listeners.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from typing import Any

from tools import output
from tools.commands.common import ManualFormatter, UsageError
from tools.commands.groups import broker_options, run_with_brokers

API_LIST_TRANSACTIONS, API_DESCRIBE_TRANSACTIONS, API_FIND_COORDINATOR = 66, 65, 10
TRANSACTION_KEY = 1
STATES = (
    "Empty",
    "Ongoing",
    "PrepareCommit",
    "PrepareAbort",
    "CompleteCommit",
    "CompleteAbort",
    "Dead",
    "PrepareEpochFence",
)


def cmd_list(args: argparse.Namespace) -> int:
    from tools import group_admin as a

    def run(brokers: Any) -> int:
        brokers.metadata([])
        rows: list[dict[str, Any]] = []
        for node_id, address in sorted(brokers.nodes.items()):
            resp = brokers.conn(address).call(
                API_LIST_TRANSACTIONS,
                1,
                {
                    "state_filters": args.state or [],
                    "producer_id_filters": args.producer_id or [],
                    "duration_filter": -1 if args.duration_filter is None else args.duration_filter,
                },
            )
            a._check(resp.error_code, f"listing transactions on broker {node_id}")
            rows += [
                {
                    "transactional_id": t.transactional_id,
                    "coordinator": node_id,
                    "producer_id": t.producer_id,
                    "state": t.transaction_state,
                }
                for t in resp.transaction_states
            ]
        rows.sort(key=lambda r: r["transactional_id"])
        if args.json:
            print(output.to_json(rows))
        elif rows:
            print(
                output.render_table(
                    ["TRANSACTIONAL-ID", "COORDINATOR", "PRODUCER-ID", "STATE"],
                    [
                        [r["transactional_id"], r["coordinator"], r["producer_id"], r["state"]]
                        for r in rows
                    ],
                )
            )
        else:
            print("No transactions.")
        return output.EXIT_OK

    return run_with_brokers(args, run)


def describe_row(node_id: int, t: Any, now_ms: int) -> dict[str, Any]:
    """One described transaction as ``--json`` shows it (times in ms, UTC ISO alongside)."""
    start = int(t.transaction_start_time_ms)
    open_ = start >= 0 and t.transaction_state not in ("Empty", "CompleteCommit", "CompleteAbort")
    return {
        "transactional_id": t.transactional_id,
        "coordinator": node_id,
        "producer_id": t.producer_id,
        "producer_epoch": t.producer_epoch,
        "state": t.transaction_state,
        "timeout_ms": int(t.transaction_timeout.total_seconds() * 1000),
        "start_time_ms": start if start >= 0 else None,
        "start_time": datetime.fromtimestamp(start / 1000, UTC).isoformat() if start >= 0 else None,
        "duration_ms": now_ms - start if open_ else None,
        "partitions": [f"{tp.topic}-{p}" for tp in t.topics for p in tp.partitions],
    }


def cmd_describe(args: argparse.Namespace) -> int:
    from tools import group_admin as a

    def run(brokers: Any) -> int:
        found = brokers.any().call(
            API_FIND_COORDINATOR,
            4,
            {"key_type": TRANSACTION_KEY, "coordinator_keys": [args.transactional_id]},
        )
        c = found.coordinators[0]
        a._check(c.error_code, f"finding the coordinator of '{args.transactional_id}'")
        from tools.txn_schema import DescribeTransactionsResponseV0

        resp = brokers.conn((c.host, c.port)).call(
            API_DESCRIBE_TRANSACTIONS,
            0,
            {"transactional_ids": [args.transactional_id]},
            response=DescribeTransactionsResponseV0,
        )
        t = resp.transaction_states[0]
        a._check(t.error_code, f"describing transactional id '{args.transactional_id}'")
        row = describe_row(c.node_id, t, round(time.time() * 1000))
        if args.json:
            print(output.to_json(row))
            return output.EXIT_OK
        print(
            output.render_table(
                [
                    "COORDINATOR",
                    "TRANSACTIONAL-ID",
                    "PRODUCER-ID",
                    "EPOCH",
                    "STATE",
                    "TIMEOUT-MS",
                    "START-TIME (UTC)",
                    "DURATION-MS",
                    "PARTITIONS",
                ],
                [
                    [
                        row["coordinator"],
                        row["transactional_id"],
                        row["producer_id"],
                        row["producer_epoch"],
                        row["state"],
                        row["timeout_ms"],
                        row["start_time"] or "-",
                        "-" if row["duration_ms"] is None else row["duration_ms"],
                        ",".join(row["partitions"]) or "-",
                    ]
                ],
            )
        )
        return output.EXIT_OK

    return run_with_brokers(args, run)


def _state(value: str) -> str:
    if value not in STATES:
        raise UsageError(f"unknown transaction state {value!r}; one of {', '.join(STATES)}")
    return value


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "transactions",
        help="list and describe transactional producers",
        formatter_class=ManualFormatter,
        description="Transactions, as Kafka's kafka-transactions.sh shows them. These commands "
        "talk to the brokers' transaction coordinators (not the controllers).",
        epilog="examples:\n"
        "  kraft transactions list --cluster ./c\n"
        "  kraft transactions list --state Ongoing --duration-filter 60000 --cluster ./c\n"
        "  kraft transactions describe --transactional-id payments-writer --cluster ./c",
    )
    tsub = p.add_subparsers(dest="transactions_command", metavar="SUBCOMMAND", required=True)
    ls = tsub.add_parser("list", help="every transactional id the coordinators know")
    ls.add_argument(
        "--state", action="append", type=_state, metavar="STATE", help="only this state (repeat)"
    )
    ls.add_argument(
        "--producer-id", action="append", type=int, metavar="ID", help="only this id (repeat)"
    )
    ls.add_argument(
        "--duration-filter",
        type=int,
        metavar="MS",
        help="only transactions open longer than MS milliseconds",
    )
    broker_options(ls)
    ls.set_defaults(handler=cmd_list)
    d = tsub.add_parser(
        "describe",
        help="producer id and epoch, state, timeout, start, duration and partitions",
        formatter_class=ManualFormatter,
    )
    d.add_argument("--transactional-id", required=True, metavar="ID")
    broker_options(d)
    d.set_defaults(handler=cmd_describe)
