"""The ``kraft`` command line: run nodes, run a local cluster, manage topics and configs.

``main(argv) -> int`` parses the arguments, runs one command handler and turns failures into
output and an exit status: 0 success, 1 a Kafka error (``Error: NAME: sentence`` on stderr, and
with ``--json`` an ``{"error", "error_code", "message"}`` document on stdout) or a launcher
failure, 2 a usage error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import tools.lean_imports  # noqa: F401  # first: before anything imports kio (see the module)
from kraft.errors import KraftError
from tools import completion, output
from tools.cluster import ClusterError
from tools.commands import (
    audit_cmd,
    cluster_cmd,
    configs,
    groups,
    log_cmd,
    quorum,
    shell_cmd,
    storage_cmd,
    topics,
    transactions,
)
from tools.commands.common import ManualFormatter, UsageError

DESCRIPTION = """\
pykraft: Kafka's KRaft metadata controller in Python.

A quorum of controller processes replicates the cluster metadata log with Raft; brokers
replay it. This command runs the nodes, runs a whole local cluster, and administers topics,
configs and the quorum through the controllers' RPC endpoints.

Commands that talk to a cluster take --bootstrap-controller HOST:PORT[,HOST:PORT] (any
controller will do) or --cluster DIR (a directory made by 'kraft cluster up'), --timeout S
and --json."""

EPILOG = """\
examples (a tour):
  kraft cluster up --dir ./c --controllers 3 --brokers 3 --metrics --detach
  kraft quorum status --cluster ./c           # leader, epoch, high watermark, lag
  kraft quorum replication --cluster ./c      # every voter and broker, lag, last contact
  kraft topics create orders --partitions 6 --replication-factor 3 --cluster ./c
  kraft topics describe orders --cluster ./c
  kraft groups describe orders-app --cluster ./c  # members, offsets, lag
  kraft transactions list --cluster ./c            # open and finished transactions
  kraft configs alter --topic orders --set retention.ms=3600000 --cluster ./c
  kraft cluster kill --dir ./c --node 1       # crash a controller; another takes over
  kraft log dump ./c/controller-2/metadata    # who changed what, record by record
  kraft shell --cluster ./c -c 'tree /brokers'
  kraft cluster down --dir ./c

environment:
  KRAFT_BOOTSTRAP_CONTROLLER  default --bootstrap-controller
  KRAFT_CLUSTER_DIR           default --cluster
  KRAFT_LOG_LEVEL             log level of controller and broker processes, any case
                              (default: their log.level setting, INFO)

shell completion:
  source <(kraft completion bash)      (zsh: kraft completion zsh)

exit status: 0 success, 1 the request or an item of it failed, 2 bad arguments,
130 interrupted.

Run 'kraft COMMAND --help' for each command's manual."""


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("pykraft")
    except Exception:
        return "unknown"


def cmd_controller(args: argparse.Namespace) -> int:
    from kraft.controller_server import main as controller_main

    return int(controller_main(args.config) or 0)


def cmd_broker(args: argparse.Namespace) -> int:
    # kio registers a hypothesis strategy for every protocol type when hypothesis is importable
    # (a test library, present in dev installs): ~0.6 s of a broker's start-up and a
    # .hypothesis/ folder in its working directory, for nothing a broker uses.
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]  # None marks the module absent
    from broker.node import main as broker_main

    return int(broker_main(args.config) or 0)


def _add_node_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = sub.add_parser(
        "controller",
        help="run a controller node",
        formatter_class=ManualFormatter,
        description="Run one controller: a voter of the Raft quorum that replicates the metadata "
        "log, serving the controller RPC API. Runs until SIGTERM/Ctrl-C.",
        epilog="example:\n  kraft controller --config ./c/controller-1/controller.properties\n\n"
        "required keys: node.id, process.roles=controller, cluster.id, "
        "controller.quorum.voters,\n  controller.quorum.raft.voters, metadata.log.dir "
        "(see docs/design.md, Configuration)",
    )
    c.add_argument("--config", required=True, metavar="FILE", help="controller.properties file")
    c.set_defaults(handler=cmd_controller)

    b = sub.add_parser(
        "broker",
        help="run a broker node",
        formatter_class=ManualFormatter,
        description="Run one broker: it registers with the controllers, replays the metadata "
        "log and serves Kafka clients on its listener. SIGTERM triggers a "
        "controlled shutdown.",
        epilog="example:\n  kraft broker --config ./c/broker-101/broker.properties\n\n"
        "required keys: node.id, process.roles=broker, cluster.id, log.dirs,\n"
        "  controller.quorum.bootstrap.servers (see docs/design.md, Configuration)",
    )
    b.add_argument("--config", required=True, metavar="FILE", help="broker.properties file")
    b.set_defaults(handler=cmd_broker)


def build_parser() -> argparse.ArgumentParser:
    """The full ``kraft`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="kraft", description=DESCRIPTION, epilog=EPILOG, formatter_class=ManualFormatter
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_node_commands(sub)
    cluster_cmd.register(sub)
    storage_cmd.register(sub)
    quorum.register(sub)
    topics.register(sub)
    configs.register(sub)
    groups.register(sub)
    transactions.register(sub)
    log_cmd.register(sub)
    shell_cmd.register(sub)
    audit_cmd.register(sub)
    completion.register(sub, build_parser, ManualFormatter)
    return parser


def _command_name(argv: Sequence[str]) -> str:
    words = [a for a in argv if not a.startswith("-")][:2]
    return "kraft " + " ".join(words) if words else "kraft"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``kraft`` command line; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help/--version (0) or a usage error (2)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else output.EXIT_USAGE)
    as_json = bool(getattr(args, "json", False))
    try:
        code: int = args.handler(args)
        return code
    except UsageError as e:
        print(f"Error: {e}\n(see '{_command_name(argv)} --help')", file=sys.stderr)
        return output.EXIT_USAGE
    except KraftError as e:
        output.report_error(e.code, e.message, as_json)
        return output.EXIT_ERROR
    except ClusterError as e:
        print(f"Error: {e}", file=sys.stderr)
        return output.EXIT_ERROR
    except KeyboardInterrupt:
        print("Interrupted.", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return output.EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
