"""``kraft quorum status|replication``: the controller quorum in the shape of Kafka's
``kafka-metadata-quorum describe --status`` and ``--replication`` (one DescribeQuorum call).

``DIVERGENT`` (pykraft's): the active controller compares every voter's log head (the hash of
the batch ending at its last offset) with its own log and names the first offset from which a
voter's history differs; ``--json`` carries each voter's ``log_head_offset``/``log_head_hash``,
so a cron job can keep witnesses of the chain elsewhere.

Lags here are in metadata log offsets: how many records a node's applied offset is behind the
leader's high watermark (the leader's log end). ``--json`` adds the derived fields to the
response; the raw per-voter Raft lag stays in ``voters[].lag``.
"""

from __future__ import annotations

import argparse
from typing import Any

from tools import output
from tools.commands.common import ManualFormatter, add_client_options, call, show


def _leader(resp: dict[str, Any]) -> int:
    leader = resp.get("leader_id")
    return leader if isinstance(leader, int) else -1


def offset_lag(resp: dict[str, Any], applied: Any) -> int | None:
    """Records ``applied`` is behind the high watermark (None when unknown)."""
    hw = resp.get("high_watermark")
    if not isinstance(applied, int) or not isinstance(hw, int):
        return None
    return max(hw - 1 - applied, 0)


def _followers(resp: dict[str, Any]) -> list[dict[str, Any]]:
    leader = _leader(resp)
    return [
        v for v in resp.get("voters", []) if not v.get("is_leader") and v.get("node_id") != leader
    ]


def max_follower_lag(resp: dict[str, Any]) -> int | None:
    """The largest metadata-offset lag among voters other than the leader (None if unknown)."""
    lags = [
        lag
        for v in _followers(resp)
        if (lag := offset_lag(resp, v.get("applied_offset"))) is not None
    ]
    return max(lags) if lags else None


def _ago(ms: Any) -> int | None:
    return ms if isinstance(ms, int) and ms >= 0 else None


def max_follower_lag_time_ms(resp: dict[str, Any]) -> int | None:
    """The longest time since a follower voter was last known caught up: its last caught-up
    time, or (behind or silent) its last contact; None without followers or data."""
    times = []
    for v in _followers(resp):
        caught_up = _ago(v.get("last_caught_up_ms"))
        t = caught_up if caught_up is not None else _ago(v.get("last_contact_ms"))
        if t is not None:
            times.append(t)
    return max(times) if times else None


def status_document(resp: dict[str, Any]) -> dict[str, Any]:
    """``quorum status --json``: the DescribeQuorum response plus the Kafka-shaped summary."""
    return {
        **resp,
        "leader_epoch": resp.get("term"),
        "max_follower_lag": max_follower_lag(resp),
        "max_follower_lag_time_ms": max_follower_lag_time_ms(resp),
        "current_voters": sorted(v["node_id"] for v in resp.get("voters", [])),
        "current_observers": sorted(o["broker_id"] for o in resp.get("observers", [])),
        "divergent_voters": sorted(resp.get("divergent_voters") or []),
    }


def _ids(ids: list[int]) -> str:
    return "[" + ",".join(map(str, ids)) + "]"


def render_status(resp: dict[str, Any]) -> str:
    """Kafka's ``describe --status`` block (plus pykraft's Raft commit index)."""
    doc = status_document(resp)
    leader = _leader(resp)
    return output.render_kv(
        [
            ("ClusterId", doc.get("cluster_id")),
            ("LeaderId", leader if leader >= 0 else "none"),
            ("LeaderEpoch", doc.get("leader_epoch")),
            ("HighWatermark", doc.get("high_watermark")),
            ("CommitIndex", doc.get("commit_index")),
            ("MaxFollowerLag", doc["max_follower_lag"]),
            ("MaxFollowerLagTimeMs", doc["max_follower_lag_time_ms"]),
            ("CurrentVoters", _ids(doc["current_voters"])),
            ("CurrentObservers", _ids(doc["current_observers"])),
            ("DivergentVoters", _ids(doc["divergent_voters"])),
        ]
    )


def replication_rows(resp: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per voter (Leader/Follower) then per observer (broker), Kafka's --replication."""
    leader = _leader(resp)
    rows = []
    for v in sorted(resp.get("voters", []), key=lambda v: v["node_id"]):
        is_leader = bool(v.get("is_leader")) or v["node_id"] == leader
        applied = v.get("applied_offset")
        head = v.get("log_head") or {}
        rows.append(
            {
                "node_id": v["node_id"],
                "status": "Leader" if is_leader else "Follower",
                "applied_offset": applied,
                "lag": offset_lag(resp, applied),
                "last_fetch_ms_ago": 0 if is_leader else _ago(v.get("last_contact_ms")),
                "last_caught_up_ms_ago": 0 if is_leader else _ago(v.get("last_caught_up_ms")),
                "log_head_offset": head.get("offset"),
                "log_head_hash": head.get("hash"),
                "divergent_from_offset": v.get("divergent_from_offset"),
            }
        )
    for o in sorted(resp.get("observers", []), key=lambda o: o["broker_id"]):
        applied = o.get("metadata_offset")
        rows.append(
            {
                "node_id": o["broker_id"],
                "status": "Observer",
                "applied_offset": applied,
                "lag": offset_lag(resp, applied),
                "last_fetch_ms_ago": _ago(o.get("last_contact_ms")),
                "last_caught_up_ms_ago": _ago(o.get("last_caught_up_ms")),
                "log_head_offset": None,
                "log_head_hash": None,
                "divergent_from_offset": None,
            }
        )
    return rows


def replication_document(resp: dict[str, Any]) -> dict[str, Any]:
    """``quorum replication --json``."""
    return {
        "cluster_id": resp.get("cluster_id"),
        "leader_id": _leader(resp),
        "term": resp.get("term"),
        "high_watermark": resp.get("high_watermark"),
        "replicas": replication_rows(resp),
    }


def _ms_ago(ms: int | None) -> str | None:
    return None if ms is None else f"{ms} ms ago"


def _divergent(offset: int | None) -> str | None:
    """A voter whose log differs from the leader's: from which offset (-1: still looking)."""
    if offset is None:
        return None
    return f"from offset {offset}" if offset >= 0 else "yes"


def render_replication(resp: dict[str, Any]) -> str:
    """Kafka's ``describe --replication`` table (times as "N ms ago")."""
    return output.render_table(
        ("NODE ID", "APPLIED OFFSET", "LAG", "LAST FETCH", "LAST CAUGHT UP", "STATUS", "DIVERGENT"),
        [
            (
                r["node_id"],
                r["applied_offset"],
                r["lag"],
                _ms_ago(r["last_fetch_ms_ago"]),
                _ms_ago(r["last_caught_up_ms_ago"]),
                r["status"],
                _divergent(r["divergent_from_offset"]),
            )
            for r in replication_rows(resp)
        ],
    )


def cmd_status(args: argparse.Namespace) -> int:
    resp = call(args, "DescribeQuorum", {})
    return show(args, resp, render_status, status_document(resp))


def cmd_replication(args: argparse.Namespace) -> int:
    resp = call(args, "DescribeQuorum", {})
    return show(args, resp, render_replication, replication_document(resp))


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``kraft quorum status|replication``."""
    p = sub.add_parser(
        "quorum",
        help="inspect the controller Raft quorum",
        formatter_class=ManualFormatter,
        description="Inspect the controller quorum that replicates the metadata log, in the "
        "shape of Kafka's kafka-metadata-quorum describe --status / --replication. "
        "Any controller can answer (a follower asks the leader).\n\n"
        "Lags are metadata records behind the leader's high watermark (its log end).",
    )
    qsub = p.add_subparsers(dest="quorum_command", metavar="COMMAND", required=True)
    s = qsub.add_parser(
        "status",
        help="leader, epoch, high watermark, max follower lag, voters, observers",
        formatter_class=ManualFormatter,
        description="Show the cluster id, the quorum leader and its epoch (the Raft term), the "
        "metadata high watermark, the Raft commit index, the largest follower lag "
        "(records) and the longest time since a follower was caught up, and the ids "
        "of the voters (controllers) and observers (brokers following the log).",
        epilog="examples:\n  kraft quorum status --cluster ./c\n"
        "  kraft quorum status --bootstrap-controller 127.0.0.1:9093 --json\n\n"
        "--json prints the DescribeQuorum response plus leader_epoch, max_follower_lag,\n"
        "max_follower_lag_time_ms, current_voters and current_observers.",
    )
    add_client_options(s)
    s.set_defaults(handler=cmd_status)
    r = qsub.add_parser(
        "replication",
        help="per-node applied offset, lag and last contact",
        formatter_class=ManualFormatter,
        description="One row per voter and per observer: the metadata offset it has applied, "
        "its lag behind the leader's high watermark, when the leader last heard from "
        "it (a follower's Raft answer, a broker's heartbeat), when it was last caught "
        "up, and its status (Leader, Follower, Observer).",
        epilog="examples:\n  kraft quorum replication --cluster ./c\n"
        "  kraft quorum replication --cluster ./c --json\n\n"
        "--json: {cluster_id, leader_id, term, high_watermark, replicas: [{node_id, status,\n"
        "applied_offset, lag, last_fetch_ms_ago, last_caught_up_ms_ago}]}",
    )
    add_client_options(r)
    r.set_defaults(handler=cmd_replication)
