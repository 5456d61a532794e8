"""``kraft quorum status``: the controller quorum as one controller sees it (DescribeQuorum)."""
from __future__ import annotations

import argparse
from typing import Any

from tools import output
from tools.commands.common import ManualFormatter, add_client_options, call, show


def max_follower_lag(resp: dict[str, Any]) -> int | None:
    """The largest ``lag`` among voters that are not the leader (None without followers)."""
    lags = [v.get("lag") for v in resp.get("voters", [])
            if not v.get("is_leader") and v.get("node_id") != resp.get("leader_id")
            and v.get("lag") is not None]
    return max(lags) if lags else None


def _contact(ms: Any) -> str | None:
    if ms is None or ms < 0:
        return None
    return f"{ms} ms ago"


def render_status(resp: dict[str, Any]) -> str:
    """Summary lines, then a voters table and (when any) an observers table."""
    leader = resp.get("leader_id", -1)
    head = output.render_kv([
        ("Leader", leader if leader is not None and leader >= 0 else "none"),
        ("Term", resp.get("term")),
        ("Commit index", resp.get("commit_index")),
        ("High watermark", resp.get("high_watermark")),
        ("Max follower lag", max_follower_lag(resp)),
    ])
    voters = sorted(resp.get("voters", []), key=lambda v: v["node_id"])
    rows = [(v["node_id"], f"{v.get('host')}:{v.get('port')}",
             "leader" if v.get("is_leader") or v["node_id"] == leader else "follower",
             v.get("applied_offset"), v.get("lag"), _contact(v.get("last_contact_ms")))
            for v in voters]
    text = head + "\n\nVoters:\n" + output.render_table(
        ("ID", "ENDPOINT", "ROLE", "APPLIED OFFSET", "LAG", "LAST CONTACT"), rows, indent="  ")
    observers = sorted(resp.get("observers", []), key=lambda o: o["broker_id"])
    if observers:
        text += "\n\nObservers (brokers):\n" + output.render_table(
            ("BROKER", "METADATA OFFSET", "LAG", "LAST CONTACT"),
            [(o["broker_id"], o.get("metadata_offset"), o.get("lag"),
              _contact(o.get("last_contact_ms")))
             for o in observers], indent="  ")
    return text


def cmd_status(args: argparse.Namespace) -> int:
    resp = call(args, "DescribeQuorum", {})
    return show(args, resp, render_status, {**resp, "max_follower_lag": max_follower_lag(resp)})


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``kraft quorum ...``."""
    p = sub.add_parser(
        "quorum", help="inspect the controller Raft quorum", formatter_class=ManualFormatter,
        description="Inspect the controller quorum that replicates the metadata log.")
    qsub = p.add_subparsers(dest="quorum_command", metavar="COMMAND", required=True)
    s = qsub.add_parser(
        "status", help="leader, term, commit index and per-voter lag",
        formatter_class=ManualFormatter,
        description="Show the quorum leader, the Raft term, the commit index and the metadata "
                    "high watermark, then for every voter its RPC endpoint, the metadata offset "
                    "it has applied, its lag behind the high watermark and when the leader last "
                    "heard from it. Brokers replaying the log are listed as observers. Any "
                    "controller can answer.",
        epilog="examples:\n  kraft quorum status --cluster ./c\n"
               "  kraft quorum status --bootstrap-controller 127.0.0.1:9093 --json\n\n"
               "--json prints the DescribeQuorum response plus \"max_follower_lag\".")
    add_client_options(s)
    s.set_defaults(handler=cmd_status)
