"""``kraft cluster ...``: run a local cluster (up/down/start/kill/status) and describe brokers."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from tools import cluster as launcher
from tools import output
from tools.cluster import ClusterError, ClusterLayout, Readiness
from tools.commands.common import (
    ManualFormatter,
    UsageError,
    add_client_options,
    call,
    non_negative_int,
    positive_float,
    positive_int,
    print_json,
    show,
)

SIGNALS = {
    "KILL": signal.SIGKILL,
    "TERM": signal.SIGTERM,
    "STOP": signal.SIGSTOP,
    "CONT": signal.SIGCONT,
    "INT": signal.SIGINT,
}


class Progress:
    """One status line on stderr, rewritten in place, cleared when done; only on a terminal
    (logs and pipes get the result, not the spinner)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.last = ""
        self.width = 0

    def __call__(self, state: Readiness, elapsed: float) -> None:
        text = f"Waiting for the cluster: {state.summary()}"
        if self.tty:
            line = f"{text} [{elapsed:.1f}s]"
            self.stream.write("\r" + line.ljust(self.width))
            self.width = len(line)
            self.stream.flush()
        self.last = text

    def done(self) -> None:
        if self.tty and self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
            self.width = 0


def parse_racks(text: str | None) -> list[str] | None:
    """``r1,r2`` → ``["r1", "r2"]``; None when not given."""
    if text is None:
        return None
    racks = [r.strip() for r in text.split(",") if r.strip()]
    if not racks:
        raise UsageError("--racks needs at least one rack name")
    return racks


def _load(directory: str) -> ClusterLayout:
    try:
        return launcher.read_cluster_json(Path(directory))
    except FileNotFoundError:
        raise ClusterError(
            f"no cluster in {directory} (no cluster.json); create one with "
            f"'kraft cluster up --dir {directory} --controllers 3'"
        ) from None


def _endpoint(node: launcher.Node) -> str:
    if isinstance(node, launcher.ControllerNode):
        return f"{node.host}:{node.rpc_port} (raft {node.raft_port})"
    return f"PLAINTEXT://{node.host}:{node.port}"


def render_layout(layout: ClusterLayout, alive: dict[int, bool] | None = None) -> str:
    """The nodes of a cluster as a table (with a STATUS column when ``alive`` is given)."""
    headers = ["NODE", "ROLE", "PID", "ENDPOINT", "RACK"]
    if alive is not None:
        headers.insert(3, "STATUS")
    rows = []
    for n in layout.nodes():
        row: list[Any] = [n.id, n.role, n.pid, _endpoint(n), getattr(n, "rack", None)]
        if alive is not None:
            row.insert(3, "running" if alive[n.id] else "stopped")
        rows.append(row)
    return output.render_table(headers, rows)


# ---- up -------------------------------------------------------------------------------------


def _prepare_layout(args: argparse.Namespace, directory: Path) -> tuple[ClusterLayout, bool]:
    """A new layout (configs written), or the existing one when DIR already has a cluster."""
    try:
        layout = launcher.read_cluster_json(directory)
    except FileNotFoundError:
        layout = launcher.plan_cluster(
            directory,
            args.controllers,
            args.brokers,
            parse_racks(args.racks),
            args.base_port,
            args.fsync,
            metrics=args.metrics,
        )
        if args.no_auth:
            print(
                "Warning: --no-auth: the controllers' RPC accepts anyone who can reach it "
                "(loopback only); anyone on this host can fence brokers or delete topics",
                file=sys.stderr,
            )
        else:
            launcher.enable_auth(layout, directory)
        launcher.ensure_raft_secret(layout, directory)
        launcher.write_node_configs(layout)
        launcher.write_cluster_json(directory, layout)
        return layout, False
    if launcher.ensure_raft_secret(layout, directory):
        launcher.write_cluster_json(directory, layout)
    running = launcher.running_nodes(layout)
    if running:
        pids = ", ".join(f"{n.name} pid {n.pid}" for n in running)
        raise ClusterError(
            f"a cluster is already running in {directory} ({pids}); stop it with "
            f"'kraft cluster down --dir {directory}' or use another --dir"
        )
    if len(layout.controllers) != args.controllers or len(layout.brokers) != args.brokers:
        raise ClusterError(
            f"{directory} already holds cluster {layout.cluster_id} with "
            f"{len(layout.controllers)} controller(s) and {len(layout.brokers)} broker(s); "
            f"restart it with 'kraft cluster start --dir {directory}' or use another --dir"
        )
    return layout, True


def _hold_into(held: list[int]) -> Callable[[int, FrameType | None], None]:
    """A signal handler that only records the signal (raised again once it is safe)."""

    def hold(signum: int, _frame: FrameType | None) -> None:
        held.append(signum)

    return hold


def _start_all(
    directory: Path, layout: ClusterLayout, children: dict[int, subprocess.Popen[bytes]]
) -> None:
    """Start every node, recording each pid in cluster.json as soon as it exists."""
    with launcher.locked(directory):
        for node in layout.nodes():
            # A Ctrl-C between spawning a node and recording its pid would leave a node that
            # 'cluster down' cannot see: hold SIGINT until the pid is on disk, then raise it.
            held: list[int] = []
            previous = signal.signal(signal.SIGINT, _hold_into(held))
            try:
                children[node.id] = launcher.start_node(node)
                launcher.write_cluster_json(directory, layout)
            finally:
                signal.signal(signal.SIGINT, previous)
            if held:
                raise KeyboardInterrupt


def _stop_and_clear(
    directory: Path, children: dict[int, subprocess.Popen[bytes]], timeout: float
) -> list[launcher.StopResult]:
    """Stop every node of the cluster in ``directory`` and clear the pids in cluster.json."""
    with launcher.locked(directory):
        layout = launcher.read_cluster_json(directory)
        results = launcher.stop_cluster(layout, timeout, children)
        for r in results:
            if r.outcome != "still running":
                r.node.pid = None
        launcher.write_cluster_json(directory, layout)
    for proc in children.values():
        try:
            proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass
    return results


def _print_stop_results(results: list[launcher.StopResult], stream: TextIO) -> None:
    print(
        output.render_table(
            ("NODE", "ROLE", "PID", "RESULT"),
            [(r.node.id, r.node.role, r.pid, r.outcome) for r in results],
        ),
        file=stream,
    )


def _monitor(children: dict[int, subprocess.Popen[bytes]], layout: ClusterLayout) -> None:
    """Report nodes that exit until interrupted (Ctrl-C / SIGTERM raise KeyboardInterrupt)."""
    names = {n.id: n.name for n in layout.nodes()}
    reported: set[int] = set()
    while True:
        for node_id, proc in children.items():
            rc = proc.poll()
            if rc is not None and node_id not in reported:
                reported.add(node_id)
                print(
                    f"{names[node_id]} (pid {proc.pid}) exited with code {rc}",
                    file=sys.stderr,
                    flush=True,
                )
        time.sleep(0.5)


def _catch_termination() -> dict[signal.Signals, Any] | None:
    """Make SIGTERM (like Ctrl-C) raise KeyboardInterrupt; returns the previous handlers."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    return previous


def _ignore_termination(handlers: dict[signal.Signals, Any] | None) -> None:
    """While stopping the nodes, further Ctrl-C/SIGTERM must not abort the shutdown."""
    if handlers is not None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _restore(handlers: dict[signal.Signals, Any] | None) -> None:
    for sig, handler in (handlers or {}).items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _print_ready(directory: Path, layout: ClusterLayout, state: Readiness) -> None:
    print(render_layout(layout))
    print(f"\nReady: {state.summary()}.")
    bootstrap = ",".join(f"{h}:{p}" for h, p in layout.controller_endpoints())
    print(f"Controllers: --bootstrap-controller {bootstrap}   (or --cluster {directory})")
    if layout.auth_dir:
        print(
            "RPC authentication is on: --cluster finds the admin credentials; with "
            f"--bootstrap-controller set KRAFT_RPC_CREDENTIALS_FILE={layout.auth_dir}/admin.credentials"
        )
    if layout.brokers and layout.auth_dir:
        print(
            "Kafka admin requests (CreateTopics, ...) need an authenticated client (SASL "
            "listener); anonymous ones get CLUSTER_AUTHORIZATION_FAILED"
        )
    if layout.brokers:
        print("Kafka bootstrap servers: " + ",".join(f"{b.host}:{b.port}" for b in layout.brokers))
    metrics = [
        f"{n.name} http://{n.host}:{n.metrics_port}/metrics"
        for n in layout.nodes()
        if n.metrics_port
    ]
    if metrics:
        print("Prometheus metrics: " + ", ".join(metrics))


def cmd_up(args: argparse.Namespace) -> int:
    directory = Path(args.dir).resolve()
    if args.racks is not None and not args.brokers:
        raise UsageError("--racks only applies to brokers; add --brokers M")
    layout, restarted = _prepare_layout(args, directory)
    handlers = _catch_termination()
    children: dict[int, subprocess.Popen[bytes]] = {}
    try:
        _start_all(directory, layout, children)
        verb = "Restarted" if restarted else "Started"
        print(f"{verb} cluster {layout.cluster_id} in {directory}", file=sys.stderr)
        progress = Progress()
        try:
            state = launcher.wait_ready(
                layout,
                args.ready_timeout,
                children,
                progress,
                required_brokers={b.id for b in layout.brokers},
            )
        finally:
            progress.done()
        if args.json:
            print_json(
                {
                    **status_document(directory, layout),
                    "leader_id": state.leader_id,
                    "ready": state.summary(),
                }
            )
        else:
            _print_ready(directory, layout, state)
        if args.detach:
            if not args.json:
                print(
                    f"Running in the background; stop with 'kraft cluster down --dir {directory}'."
                )
            return output.EXIT_OK
        print("Running in the foreground; press Ctrl-C to stop every node.", flush=True)
        _monitor(children, layout)
        return output.EXIT_OK  # not reached
    except ClusterError as e:
        print(f"Error: {e}", file=sys.stderr)
        if children:
            print("Stopping the nodes that were started...", file=sys.stderr)
            _print_stop_results(_stop_and_clear(directory, children, args.stop_timeout), sys.stderr)
        return output.EXIT_ERROR
    except KeyboardInterrupt:
        _ignore_termination(handlers)
        print("\nStopping the cluster (brokers first)...", file=sys.stderr)
        results = _stop_and_clear(directory, children, args.stop_timeout)
        _print_stop_results(results, sys.stderr)
        stuck = any(r.outcome == "still running" for r in results)
        return output.EXIT_ERROR if stuck else output.EXIT_OK
    finally:
        _restore(handlers)


# ---- down / start / kill / status -----------------------------------------------------------


def cmd_down(args: argparse.Namespace) -> int:
    directory = Path(args.dir).resolve()
    _load(str(directory))
    results = _stop_and_clear(directory, {}, args.timeout)
    stuck = any(r.outcome == "still running" for r in results)
    if args.json:
        print_json(
            {
                "nodes": [
                    {"id": r.node.id, "role": r.node.role, "pid": r.pid, "result": r.outcome}
                    for r in results
                ]
            }
        )
    else:
        _print_stop_results(results, sys.stdout)
    return output.EXIT_ERROR if stuck else output.EXIT_OK


def cmd_start(args: argparse.Namespace) -> int:
    directory = Path(args.dir).resolve()
    children: dict[int, subprocess.Popen[bytes]] = {}
    _load(str(directory))
    with launcher.locked(directory):
        layout = _load(str(directory))
        if launcher.ensure_raft_secret(layout, directory):  # a directory from before secrets
            launcher.write_cluster_json(directory, layout)
        if args.node is not None:
            node = layout.node(args.node)
            if launcher.node_alive(node):
                raise ClusterError(f"{node.name} is already running (pid {node.pid})")
            targets = [node]
        else:
            targets = [n for n in layout.nodes() if not launcher.node_alive(n)]
        for node in targets:
            children[node.id] = launcher.start_node(node)
        launcher.write_cluster_json(directory, layout)
    if not targets and not args.json:
        print("Every node is already running.")
        return output.EXIT_OK
    if not args.json:
        for node in targets:
            print(f"Started {node.name} (pid {node.pid}); log: {node.log_file}")
    state = None
    if args.wait:
        progress = Progress()
        required_brokers = {n.id for n in layout.brokers if launcher.node_alive(n)}
        try:
            state = launcher.wait_ready(
                layout,
                args.ready_timeout,
                children,
                progress,
                required_controllers={n.id for n in targets if n.role == "controller"},
                required_brokers=required_brokers,
            )
        finally:
            progress.done()
        if not args.json:
            print(f"Ready: {state.summary()}.")
    if args.json:
        print_json(
            {
                "started": [
                    {"id": n.id, "role": n.role, "pid": n.pid, "log_file": n.log_file}
                    for n in targets
                ],
                "ready": state.summary() if state is not None else None,
            }
        )
    return output.EXIT_OK


def cmd_kill(args: argparse.Namespace) -> int:
    directory = Path(args.dir).resolve()
    layout = _load(str(directory))
    node = layout.node(args.node)
    sig = SIGNALS[args.signal]
    if not launcher.signal_node(node, sig):
        raise ClusterError(f"{node.name} is not running")
    doc: dict[str, Any] = {
        "node": node.id,
        "role": node.role,
        "pid": node.pid,
        "signal": args.signal,
        "exited": None,
    }
    if not args.json:
        print(f"Sent SIG{args.signal} to {node.name} (pid {node.pid}).")
    if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT) and not args.no_wait:
        doc["exited"] = launcher.wait_until(lambda: not launcher.node_alive(node), args.timeout)
        if not doc["exited"]:
            print(
                f"Error: {node.name} (pid {node.pid}) is still running after {args.timeout:g}s",
                file=sys.stderr,
            )
        elif not args.json:
            print(f"{node.name} exited.")
    if args.json:
        print_json(doc)
    return output.EXIT_OK if doc["exited"] is not False else output.EXIT_ERROR


def status_document(directory: Path, layout: ClusterLayout) -> dict[str, Any]:
    """``kraft cluster status --json``: cluster.json's shape plus ``alive`` per node."""
    doc = layout.to_dict()
    doc["dir"] = str(directory)
    for entry, c in zip(doc["controllers"], layout.controllers):
        entry["alive"] = launcher.node_alive(c)
    for entry, b in zip(doc["brokers"], layout.brokers):
        entry["alive"] = launcher.node_alive(b)
    return doc


def cmd_status(args: argparse.Namespace) -> int:
    directory = Path(args.dir).resolve()
    layout = _load(str(directory))
    if args.json:
        print_json(status_document(directory, layout))
        return output.EXIT_OK
    alive = {n.id: launcher.node_alive(n) for n in layout.nodes()}
    print(
        f"Cluster {layout.cluster_id} in {directory}: "
        f"{sum(alive.values())}/{len(alive)} node(s) running\n"
    )
    print(render_layout(layout, alive))
    return output.EXIT_OK


# ---- describe (a client command) ------------------------------------------------------------


def _listeners(listeners: Any) -> list[str]:
    out = []
    for item in listeners or ():
        if isinstance(item, dict):
            out.append(f"{item.get('name', 'PLAINTEXT')}://{item.get('host')}:{item.get('port')}")
        else:
            out.append(str(item))
    return out


def _state(broker: dict[str, Any]) -> str | None:
    """The broker's state, with its offline log dirs when the active controller knows of any."""
    state: str | None = broker.get("state")
    offline = broker.get("offline_log_dirs")
    if offline:
        return f"{state}, log dir(s) offline: {', '.join(map(str, offline))}"
    return state


def render_describe(resp: dict[str, Any]) -> str:
    """Cluster id, active controller and a broker table."""
    controller = resp.get("controller_id", -1)
    head = output.render_kv(
        [
            ("Cluster id", resp.get("cluster_id")),
            (
                "Active controller",
                controller if controller is not None and controller >= 0 else "none",
            ),
            ("Metadata offset", resp.get("offset")),
        ]
    )
    brokers = sorted(resp.get("brokers", []), key=lambda b: b["broker_id"])
    if not brokers:
        return head + "\n\nNo brokers registered."
    rows = [
        (
            b["broker_id"],
            b.get("epoch"),
            b.get("rack") or None,
            _state(b),
            _listeners(b.get("listeners")),
        )
        for b in brokers
    ]
    return (
        head + "\n\n" + output.render_table(("BROKER", "EPOCH", "RACK", "STATE", "LISTENERS"), rows)
    )


def cmd_describe(args: argparse.Namespace) -> int:
    return show(args, call(args, "DescribeCluster", {}), render_describe)


# ---- parser ---------------------------------------------------------------------------------


def _port(text: str) -> int:
    value = non_negative_int(text)
    if not 1024 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a usable port: {text!r}")
    return value


def _dir_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", required=True, metavar="DIR", help="the cluster directory")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``kraft cluster ...``."""
    p = sub.add_parser(
        "cluster",
        help="run a local cluster; describe brokers",
        formatter_class=ManualFormatter,
        description="Run a whole pykraft cluster on this machine (controllers and brokers as "
        "separate processes on 127.0.0.1), and describe the brokers of any cluster.\n\n"
        "A cluster directory holds cluster.json (ids, ports, pids) and one "
        "sub-directory per node with its properties file, data and node.log. "
        "Controllers get ids 1..N, brokers 101..100+M; ports are chosen at 'up' "
        "and kept across restarts.",
        epilog="examples:\n"
        "  kraft cluster up --dir ./c --controllers 3 --brokers 3 --racks a,b,c --detach\n"
        "  kraft cluster status --dir ./c\n"
        "  kraft cluster kill --dir ./c --node 1          # crash the controller 1\n"
        "  kraft cluster start --dir ./c --node 1 --wait  # bring it back\n"
        "  kraft cluster describe --cluster ./c\n"
        "  kraft cluster down --dir ./c",
    )
    csub = p.add_subparsers(dest="cluster_command", metavar="COMMAND", required=True)

    up = csub.add_parser(
        "up",
        help="create and start a local cluster",
        formatter_class=ManualFormatter,
        description="Create a cluster in DIR (cluster id, free loopback ports, one properties "
        "file per node), start every node in the background, and wait until a "
        "controller reports a quorum leader and every broker is unfenced. Progress "
        "goes to stderr.\n\n"
        "Without --detach the command stays in the foreground and Ctrl-C (or "
        "SIGTERM) stops every node, brokers first. With --detach it returns once "
        "the cluster is ready.\n\n"
        "If DIR already holds a stopped cluster of the same shape, it is restarted "
        "with its existing ids, ports and data; a running one is an error.",
        epilog="examples:\n"
        "  kraft cluster up --dir ./c --controllers 3\n"
        "  kraft cluster up --dir ./c --controllers 3 --brokers 3 --racks r1,r2 --detach\n"
        "  kraft cluster up --dir ./c --controllers 1 --fsync never --base-port 19090\n\n"
        "exit status: 0 ready (or stopped cleanly), 1 a node failed or the cluster was "
        "not ready in time (its nodes are stopped again), 2 bad arguments",
    )
    _dir_arg(up)
    up.add_argument(
        "--controllers",
        type=positive_int,
        required=True,
        metavar="N",
        help="number of controllers (voters), ids 1..N",
    )
    up.add_argument(
        "--brokers",
        type=non_negative_int,
        default=0,
        metavar="M",
        help="number of brokers, ids 101..100+M (default 0)",
    )
    up.add_argument(
        "--racks", metavar="R1,R2,...", help="assign broker.rack round-robin over these racks"
    )
    up.add_argument(
        "--detach", action="store_true", help="return once the cluster is ready, leaving it running"
    )
    up.add_argument(
        "--fsync",
        choices=("always", "never"),
        default="always",
        help="metadata.log.fsync of the controllers (default always)",
    )
    up.add_argument(
        "--auth",
        action="store_true",
        help="kept for compatibility: RPC authentication is the default (random credentials "
        "in DIR/auth for the users admin (the CLI), broker and controller; --cluster DIR "
        "picks them up)",
    )
    up.add_argument(
        "--no-auth",
        action="store_true",
        help="do not require controller RPC authentication (warned about; the Raft port is "
        "always encrypted with DIR/raft.secret)",
    )
    up.add_argument(
        "--base-port",
        type=_port,
        metavar="P",
        help="use consecutive ports from P instead of picking free ones: per "
        "controller RPC then Raft, then per broker listener then admin",
    )
    up.add_argument(
        "--metrics",
        action="store_true",
        help="serve Prometheus metrics from every node on a port of its own "
        "(metrics.port; listed in cluster.json as metrics_port)",
    )
    up.add_argument(
        "--ready-timeout",
        type=positive_float,
        default=60.0,
        metavar="S",
        help="how long to wait for the cluster to be ready (default 60)",
    )
    up.add_argument(
        "--stop-timeout",
        type=positive_float,
        default=20.0,
        metavar="S",
        help="on stop, how long each node gets before SIGKILL (default 20)",
    )
    up.add_argument(
        "--json",
        action="store_true",
        help="once ready, print cluster.json plus alive, leader_id and ready (progress "
        "stays on stderr)",
    )
    up.set_defaults(handler=cmd_up)

    down = csub.add_parser(
        "down",
        help="stop every node of a local cluster",
        formatter_class=ManualFormatter,
        description="Stop the cluster in DIR: SIGTERM the brokers (they shut down through the "
        "controllers) and wait, then the controllers; nodes still running after "
        "--timeout seconds are killed. Only processes whose command line still "
        "names their config file are signalled. Data is kept: 'kraft cluster start' "
        "or 'up' brings the cluster back.",
        epilog="example:\n  kraft cluster down --dir ./c --timeout 10",
    )
    _dir_arg(down)
    down.add_argument(
        "--timeout",
        type=positive_float,
        default=20.0,
        metavar="S",
        help="seconds per phase before SIGKILL (default 20)",
    )
    down.add_argument(
        "--json", action="store_true", help='print {"nodes": [{id, role, pid, result}]}'
    )
    down.set_defaults(handler=cmd_down)

    start = csub.add_parser(
        "start",
        help="(re)start stopped nodes",
        formatter_class=ManualFormatter,
        description="Start one node (--node) or every node that is not running, from the "
        "existing configuration in DIR (same id, ports and data), and record the "
        "new pid in cluster.json.",
        epilog="examples:\n  kraft cluster start --dir ./c --node 2 --wait\n"
        "  kraft cluster start --dir ./c",
    )
    _dir_arg(start)
    start.add_argument("--node", type=int, metavar="ID", help="the node to start")
    start.add_argument(
        "--wait",
        action="store_true",
        help="wait until restarted controllers see a leader and running brokers are unfenced",
    )
    start.add_argument(
        "--ready-timeout",
        type=positive_float,
        default=60.0,
        metavar="S",
        help="with --wait: how long to wait (default 60)",
    )
    start.add_argument(
        "--json",
        action="store_true",
        help='print {"started": [{id, role, pid, log_file}], "ready": summary or null}',
    )
    start.set_defaults(handler=cmd_start)

    kill = csub.add_parser(
        "kill",
        help="send a signal to one node",
        formatter_class=ManualFormatter,
        description="Send a signal to one node of the cluster (default KILL, a crash). STOP "
        "freezes the process (a hung node), CONT resumes it. For KILL/TERM/INT the "
        "command waits until the process has exited.",
        epilog="examples:\n  kraft cluster kill --dir ./c --node 1\n"
        "  kraft cluster kill --dir ./c --node 102 --signal STOP\n"
        "  kraft cluster kill --dir ./c --node 102 --signal CONT",
    )
    _dir_arg(kill)
    kill.add_argument("--node", type=int, required=True, metavar="ID", help="the node")
    kill.add_argument(
        "--signal",
        choices=sorted(SIGNALS),
        default="KILL",
        type=str.upper,
        help="signal to send (default KILL)",
    )
    kill.add_argument(
        "--timeout",
        type=positive_float,
        default=10.0,
        metavar="S",
        help="how long to wait for the node to exit (default 10)",
    )
    kill.add_argument("--no-wait", action="store_true", help="do not wait for the node to exit")
    kill.add_argument(
        "--json",
        action="store_true",
        help='print {"node", "role", "pid", "signal", "exited": true/false/null}',
    )
    kill.set_defaults(handler=cmd_kill)

    status = csub.add_parser(
        "status",
        help="which nodes of a local cluster are running",
        formatter_class=ManualFormatter,
        description="List the nodes recorded in DIR/cluster.json with their pid, whether that "
        "pid is still the node's process, and their endpoints.",
        epilog="examples:\n  kraft cluster status --dir ./c\n"
        '  kraft cluster status --dir ./c --json   # cluster.json plus "alive" per node',
    )
    _dir_arg(status)
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(handler=cmd_status)

    desc = csub.add_parser(
        "describe",
        help="brokers: epoch, rack, state, listeners",
        formatter_class=ManualFormatter,
        description="Describe the cluster as the controllers see it: cluster id, the active "
        "controller, and every registered broker with its epoch, rack, state "
        "(fenced, unfenced, controlled-shutdown) and listeners.",
        epilog="examples:\n  kraft cluster describe --cluster ./c\n"
        "  kraft cluster describe --bootstrap-controller 127.0.0.1:9093 --json",
    )
    add_client_options(desc)
    desc.set_defaults(handler=cmd_describe)
