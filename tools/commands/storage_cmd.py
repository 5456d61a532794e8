"""``kraft storage format | random-uuid | recover``: data directory identity and recovery.

The shape of Kafka's ``kafka-storage.sh``. ``recover --from-peers`` rebuilds a controller whose
directory is damaged or lost: it checks that the other controllers run a quorum of the same
cluster, moves the old directory aside (kept for inspection), formats an empty one that joins
the running quorum, and tells the operator to start the controller: it then receives the
leader's snapshot and log, and votes only once it has caught up (``kraft.quorum.raft``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from kraft.config import ConfigError
from kraft.errors import KraftError
from kraft.storage import meta_properties as mp
from kraft.storage.format import format_storage
from tools.commands.common import ManualFormatter, UsageError, call_endpoints, print_json
from tools.node_storage import node_storage


def _storage(config: str) -> Any:
    try:
        return node_storage(config)
    except (ConfigError, OSError) as e:
        raise UsageError(f"cannot read {config}: {e}") from None


def cmd_random_uuid(args: argparse.Namespace) -> int:
    uuid = mp.random_uuid()
    if args.json:
        print_json({"uuid": uuid})
    else:
        print(uuid)
    return 0


def cmd_format(args: argparse.Namespace) -> int:
    storage = _storage(args.config)
    initial = True if args.initial_controllers else False if args.no_initial_controllers else None
    try:
        lines = format_storage(
            storage, args.cluster_id, ignore_formatted=args.ignore_formatted, initial=initial
        )
    except mp.StorageIdentityError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"Error: formatting failed: {e}", file=sys.stderr)
        return 1
    if args.json:
        print_json({"config": args.config, "node_id": storage.node_id, "messages": list(lines)})
    else:
        for line in lines:
            print(line)
    return 0


def _peer_quorum(config_path: str) -> dict[str, Any]:
    """DescribeQuorum from the other controllers (the node itself is down)."""
    from kraft.config import ControllerConfig

    cfg = ControllerConfig.load(config_path)
    peers = [addr for vid, addr in sorted(cfg.rpc_voters.items()) if vid != cfg.node_id]
    if not peers:
        raise UsageError("a single-controller cluster has no peers to recover from")
    reply = call_endpoints(peers, "DescribeQuorum", {}, 5.0, cfg.rpc_client_credentials)
    if reply.get("cluster_id") != cfg.cluster_id:
        raise UsageError(
            f"the other controllers belong to cluster {reply.get('cluster_id')!r}, not "
            f"{cfg.cluster_id!r}: check {config_path}"
        )
    if reply.get("leader_id", -1) < 0:
        raise UsageError(
            "the other controllers have no leader: recover needs a running quorum (a majority "
            "of the controllers up); start them first"
        )
    return reply


def cmd_recover(args: argparse.Namespace) -> int:
    storage = _storage(args.config)
    if storage.role != "controller":
        raise UsageError(
            "recover --from-peers rebuilds a controller; a broker re-replicates "
            "its partitions by itself after `kraft storage format`"
        )
    if not args.from_peers:
        raise UsageError("say where to recover from: --from-peers")
    try:
        quorum = _peer_quorum(args.config)
    except KraftError as e:
        print(
            f"Error: cannot reach the other controllers ({e.message}): recover needs a running "
            "quorum of this cluster",
            file=sys.stderr,
        )
        return 1
    (directory,) = storage.directories
    moved = None
    if directory.exists() and any(directory.iterdir()):
        moved = directory.with_name(f"{directory.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(directory, moved)
    try:
        format_storage(storage, initial=False)
    except (mp.StorageIdentityError, OSError) as e:
        print(f"Error: formatting {directory} failed: {e}", file=sys.stderr)
        return 1
    if args.json:
        print_json(
            {
                "directory": str(directory),
                "moved_to": None if moved is None else str(moved),
                "leader_id": quorum["leader_id"],
                "term": quorum["term"],
            }
        )
        return 0
    print(f"leader: controller {quorum['leader_id']} (term {quorum['term']})")
    if moved is not None:
        print(f"old data moved to {moved} (delete it once the controller has caught up)")
    print(
        f"{directory}: formatted to join the running quorum. Start the controller now "
        f"(`kraft controller --config {args.config}`, or `kraft cluster start --node "
        f"{storage.node_id}`): it copies the leader's snapshot and log, and votes only once "
        "caught up (`kraft quorum status` shows it)."
    )
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``kraft storage ...``."""
    p = sub.add_parser(
        "storage",
        help="format data directories; rebuild a controller from its peers",
        formatter_class=ManualFormatter,
        description="Every data directory carries meta.properties (cluster.id, node.id, "
        "directory.id, version); a node refuses to start without it. 'format' writes it "
        "('kraft cluster up' formats every node), 'random-uuid' makes a cluster id, 'recover' "
        "rebuilds a controller whose directory was lost or damaged from the other controllers.",
        epilog="examples:\n"
        "  kraft storage random-uuid\n"
        "  kraft storage format --config c1.properties --initial-controllers\n"
        "  kraft storage format --config b101.properties\n"
        "  kraft storage format --config c1.properties --ignore-formatted   # adopt old data\n"
        "  kraft storage recover --config c1.properties --from-peers",
    )
    ssub = p.add_subparsers(dest="storage_command", metavar="COMMAND", required=True)
    u = ssub.add_parser("random-uuid", help="print a new random cluster id")
    u.add_argument("--json", action="store_true", help="print JSON")
    u.set_defaults(handler=cmd_random_uuid)
    f = ssub.add_parser(
        "format",
        help="write meta.properties into a node's data directories",
        formatter_class=ManualFormatter,
        description="Format the directories named by a controller's metadata.log.dir or a "
        "broker's log.dirs. Refuses a formatted directory, or one holding data, unless "
        "--ignore-formatted (formatted ones are left as they are, old data is adopted).",
    )
    f.add_argument("--config", required=True, help="the node's properties file")
    f.add_argument("--cluster-id", help="must equal cluster.id in the config (default: it)")
    f.add_argument("--ignore-formatted", action="store_true", help="skip formatted directories")
    g = f.add_mutually_exclusive_group()
    g.add_argument(
        "--initial-controllers",
        action="store_true",
        help="controller: a member of a new cluster's quorum",
    )
    g.add_argument(
        "--no-initial-controllers",
        action="store_true",
        help="controller: joins a running quorum (votes only once caught up)",
    )
    f.add_argument("--json", action="store_true", help="print JSON")
    f.set_defaults(handler=cmd_format)
    r = ssub.add_parser(
        "recover",
        help="rebuild a stopped controller's directory from the other controllers",
        formatter_class=ManualFormatter,
        description="Checks that the other controllers run a quorum of this cluster, moves the "
        "controller's directory aside (DIR.damaged-TIME), formats an empty one that joins the "
        "running quorum; start the controller afterwards. Never run it on a running controller.",
    )
    r.add_argument("--config", required=True, help="the controller's properties file")
    r.add_argument("--from-peers", action="store_true", help="copy the state from the quorum")
    r.add_argument("--json", action="store_true", help="print JSON")
    r.set_defaults(handler=cmd_recover)
