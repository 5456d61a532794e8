"""The local cluster launcher behind ``kraft cluster``: plan, configure, start and stop nodes.

A local cluster lives in one directory (design.md, "Local cluster directory")::

    DIR/cluster.json                      ids, ports, pids, config and log paths of every node
    DIR/controller-<id>/controller.properties, metadata/, node.log
    DIR/broker-<id>/broker.properties, data/, node.log
    DIR/raft.secret                       the Raft secret every controller encrypts with (0600)
    DIR/auth/                             RPC users and client credentials (not with --no-auth)

Node ids: controllers are ``1..N``, brokers ``101..100+M`` (so a broker id never collides with
a controller id in logs and tables). Ports are chosen once, at ``up``, and live in the
properties files and cluster.json, so restarting a node (``kraft cluster start``) reuses them.

Every node runs as ``python -m tools.cli controller|broker --config <abs path>`` in its own
session, so the config path in its command line identifies it: a pid is only signalled when
its command line still contains that path (:func:`pid_owned`).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tools.free_ports import pick_free_ports

if TYPE_CHECKING:
    from kraft.rpc.auth import ClientCredentials

CLUSTER_FILE = "cluster.json"
LOCK_FILE = ".cluster.lock"
HOST = "127.0.0.1"
FIRST_BROKER_ID = 101
PROJECT_ROOT = Path(__file__).resolve().parent.parent


class ClusterError(Exception):
    """A launcher failure with a sentence for the user (no Kafka error code)."""


# ---- layout ---------------------------------------------------------------------------------


@dataclass
class ControllerNode:
    id: int
    host: str
    rpc_port: int
    raft_port: int
    pid: int | None
    config: str
    metadata_dir: str
    log_file: str
    metrics_port: int = 0  # Prometheus endpoint (metrics.port); 0 = off

    role = "controller"

    @property
    def name(self) -> str:
        return f"controller-{self.id}"


@dataclass
class BrokerNode:
    id: int
    host: str
    port: int
    pid: int | None
    config: str
    log_dirs: str
    rack: str | None
    log_file: str
    admin_port: int = 0
    metrics_port: int = 0  # Prometheus endpoint (metrics.port); 0 = off

    role = "broker"

    @property
    def name(self) -> str:
        return f"broker-{self.id}"


Node = ControllerNode | BrokerNode


@dataclass
class ClusterLayout:
    """Everything ``cluster.json`` records; the directory is not stored (it can be moved)."""

    cluster_id: str
    controllers: list[ControllerNode] = field(default_factory=list)
    brokers: list[BrokerNode] = field(default_factory=list)
    fsync: str = "always"
    auth_dir: str | None = None  # RPC credentials (see enable_auth; none with --no-auth)
    raft_secret: str | None = None  # the Raft secret file (see ensure_raft_secret)

    def nodes(self) -> list[Node]:
        """Controllers then brokers."""
        return [*self.controllers, *self.brokers]

    def node(self, node_id: int) -> Node:
        for n in self.nodes():
            if n.id == node_id:
                return n
        ids = ", ".join(str(n.id) for n in self.nodes())
        raise ClusterError(f"no node {node_id} in this cluster (nodes: {ids})")

    def controller_endpoints(self) -> list[tuple[str, int]]:
        return [(c.host, c.rpc_port) for c in self.controllers]

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster_id": self.cluster_id,
            "fsync": self.fsync,
            **({"auth_dir": self.auth_dir} if self.auth_dir else {}),
            **({"raft_secret": self.raft_secret} if self.raft_secret else {}),
            "controllers": [_node_dict(c) for c in self.controllers],
            "brokers": [_node_dict(b) for b in self.brokers],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClusterLayout:
        return cls(
            cluster_id=d["cluster_id"],
            controllers=[ControllerNode(**c) for c in d.get("controllers", [])],
            brokers=[BrokerNode(**b) for b in d.get("brokers", [])],
            fsync=d.get("fsync", "always"),
            auth_dir=d.get("auth_dir"),
            raft_secret=d.get("raft_secret"),
        )


def _node_dict(node: Node) -> dict[str, Any]:
    """A node's cluster.json entry; ``metrics_port`` only when metrics are on."""
    d = asdict(node)
    if not d["metrics_port"]:
        del d["metrics_port"]
    return d


def new_cluster_id() -> str:
    """A Kafka-style cluster id: a random UUID as 22 characters of unpadded base64url."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")


def port_is_free(port: int, host: str = HOST) -> bool:
    """True when ``host:port`` can be bound right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def ports_from_base(base: int, count: int, host: str = HOST) -> list[int]:
    """``base, base+1, ...``; every one must be free."""
    ports = list(range(base, base + count))
    if ports[-1] > 65535:
        raise ClusterError(f"--base-port {base} leaves no room for {count} ports")
    busy = [p for p in ports if not port_is_free(p, host)]
    if busy:
        raise ClusterError(
            f"port(s) {', '.join(map(str, busy))} already in use; choose another "
            "--base-port or leave it out to pick free ports"
        )
    return ports


def plan_cluster(
    directory: Path,
    controllers: int,
    brokers: int = 0,
    racks: list[str] | None = None,
    base_port: int | None = None,
    fsync: str = "always",
    cluster_id: str | None = None,
    metrics: bool = False,
) -> ClusterLayout:
    """Choose ids, ports and paths for a new cluster in ``directory`` (absolute paths).

    Ports, in order: per controller RPC then Raft, then per broker listener then admin port,
    then (``metrics``) one metrics port per node in the same node order.
    With ``base_port`` they are consecutive from it, otherwise free ports outside the
    ephemeral range (``tools.free_ports``).
    """
    if controllers < 1:
        raise ClusterError("a cluster needs at least one controller")
    directory = directory.resolve()
    count = 2 * controllers + 2 * brokers
    total = count + (controllers + brokers if metrics else 0)
    ports = ports_from_base(base_port, total) if base_port else pick_free_ports(total)
    it = iter(ports[:count])
    layout = ClusterLayout(cluster_id or new_cluster_id(), fsync=fsync)
    for node_id in range(1, controllers + 1):
        home = directory / f"controller-{node_id}"
        layout.controllers.append(
            ControllerNode(
                id=node_id,
                host=HOST,
                rpc_port=next(it),
                raft_port=next(it),
                pid=None,
                config=str(home / "controller.properties"),
                metadata_dir=str(home / "metadata"),
                log_file=str(home / "node.log"),
            )
        )
    for i in range(brokers):
        node_id = FIRST_BROKER_ID + i
        home = directory / f"broker-{node_id}"
        layout.brokers.append(
            BrokerNode(
                id=node_id,
                host=HOST,
                port=next(it),
                admin_port=next(it),
                pid=None,
                config=str(home / "broker.properties"),
                log_dirs=str(home / "data"),
                rack=racks[i % len(racks)] if racks else None,
                log_file=str(home / "node.log"),
            )
        )
    if metrics:
        for node, port in zip(layout.nodes(), ports[count:]):
            node.metrics_port = port
    return layout


# ---- properties files -----------------------------------------------------------------------


def controller_properties(layout: ClusterLayout, node: ControllerNode) -> dict[str, str]:
    """The controller.properties keys for one controller of ``layout``."""
    return {
        "node.id": str(node.id),
        "process.roles": "controller",
        "cluster.id": layout.cluster_id,
        "controller.quorum.voters": ",".join(
            f"{c.id}@{c.host}:{c.rpc_port}" for c in layout.controllers
        ),
        "controller.quorum.raft.voters": ",".join(
            f"{c.id}@{c.host}:{c.raft_port}" for c in layout.controllers
        ),
        "metadata.log.dir": node.metadata_dir,
        "metadata.log.fsync": layout.fsync,
        **({"metrics.port": str(node.metrics_port)} if node.metrics_port else {}),
        **({"controller.raft.secret.file": layout.raft_secret} if layout.raft_secret else {}),
        **auth_properties(layout, "controller"),
    }


def broker_properties(layout: ClusterLayout, node: BrokerNode) -> dict[str, str]:
    """The broker.properties keys for one broker of ``layout``."""
    props = {
        "node.id": str(node.id),
        "process.roles": "broker",
        "cluster.id": layout.cluster_id,
        "listeners": f"PLAINTEXT://{node.host}:{node.port}",
        "log.dirs": node.log_dirs,
        "controller.quorum.bootstrap.servers": ",".join(
            f"{h}:{p}" for h, p in layout.controller_endpoints()
        ),
        # a local development cluster, as Kafka's shipped server.properties: no initial
        # rebalance delay, smaller __consumer_offsets and __transaction_state (Kafka: 3000 ms, 50, 50)
        "group.initial.rebalance.delay.ms": "0",
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.num.partitions": "10",
        "log.cleaner.backoff.ms": "1000",  # Kafka: 15000; a dev cluster compacts promptly
    }
    if node.admin_port:
        props["broker.admin.port"] = str(node.admin_port)
    if node.rack:
        props["broker.rack"] = node.rack
    if node.metrics_port:
        props["metrics.port"] = str(node.metrics_port)
    props.update(auth_properties(layout, "broker"))
    return props


RAFT_SECRET_KEY = "controller.raft.secret.file"


def ensure_raft_secret(layout: ClusterLayout, directory: Path) -> bool:
    """Give the cluster a Raft secret if it has none: ``DIR/raft.secret`` (32 random bytes,
    base64, mode 0600), named by every controller's ``controller.raft.secret.file``. A
    directory made before secrets were required gets one here, and its controllers' properties
    files get the key appended when they lack it. Returns whether a secret was created."""
    if layout.raft_secret and Path(layout.raft_secret).is_file():
        return False
    directory.mkdir(parents=True, exist_ok=True)
    path = directory.resolve() / "raft.secret"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(base64.b64encode(secrets.token_bytes(32)).decode("ascii") + "\n")
    os.chmod(path, 0o600)
    layout.raft_secret = str(path)
    for c in layout.controllers:
        props = Path(c.config)
        if props.is_file() and not any(
            line.split("=", 1)[0].strip() == RAFT_SECRET_KEY
            for line in props.read_text(encoding="utf-8").splitlines()
        ):
            with props.open("a", encoding="utf-8") as f:
                f.write(f"{RAFT_SECRET_KEY}={path}\n")
    return True


def enable_auth(layout: ClusterLayout, directory: Path) -> None:
    """RPC authentication (the default of ``cluster up``): random passwords for the users admin (the CLI), broker and controller in
    ``DIR/auth`` (hashes in ``rpc-users``, client files mode 0600); nodes and CLI use them."""
    from kraft.rpc.auth import write_cluster_credentials

    auth_dir = directory.resolve() / "auth"
    write_cluster_credentials(auth_dir)
    layout.auth_dir = str(auth_dir)


def auth_properties(layout: ClusterLayout, role: str) -> dict[str, str]:
    """The RPC authentication keys of a node (none without ``--auth``)."""
    if not layout.auth_dir:
        return {}
    props = {
        "controller.rpc.client.credentials.file": str(Path(layout.auth_dir) / f"{role}.credentials")
    }
    if role == "controller":
        props["controller.rpc.auth.credentials.file"] = str(Path(layout.auth_dir) / "rpc-users")
    return props


def admin_credentials(layout: ClusterLayout) -> ClientCredentials | None:
    """The CLI's credentials for a cluster started with ``--auth`` (None otherwise)."""
    if not layout.auth_dir:
        return None
    from kraft.rpc.auth import ClientCredentials

    return ClientCredentials.load(Path(layout.auth_dir) / "admin.credentials")


def write_node_configs(layout: ClusterLayout) -> None:
    """Create every node's directory and write its properties file."""
    from kraft.config import write_properties

    for c in layout.controllers:
        Path(c.metadata_dir).mkdir(parents=True, exist_ok=True)
        write_properties(c.config, controller_properties(layout, c))
    for b in layout.brokers:
        for d in b.log_dirs.split(","):
            Path(d).mkdir(parents=True, exist_ok=True)
        write_properties(b.config, broker_properties(layout, b))
    format_nodes(layout)


def format_nodes(layout: ClusterLayout) -> None:
    """``kraft storage format`` for every node of a new cluster (controllers as the initial
    quorum); the nodes refuse to start without it."""
    from kraft.storage.format import format_storage
    from tools.node_storage import node_storage

    for node in layout.nodes():
        format_storage(node_storage(node.config), layout.cluster_id, initial=True)


# ---- cluster.json ---------------------------------------------------------------------------


def read_cluster_json(directory: Path) -> ClusterLayout:
    """Load ``DIR/cluster.json`` (FileNotFoundError if absent, ClusterError if unreadable)."""
    path = Path(directory) / CLUSTER_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return ClusterLayout.from_dict(data)
    except FileNotFoundError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ClusterError(f"{path} is not a valid cluster file: {e}") from None


def write_cluster_json(directory: Path, layout: ClusterLayout) -> None:
    """Write ``DIR/cluster.json`` atomically (temp file + rename)."""
    path = Path(directory) / CLUSTER_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(layout.to_dict(), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Hold an exclusive lock on the (existing) cluster directory for a read-modify-write of
    cluster.json."""
    with open(Path(directory) / LOCK_FILE, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def update_pid(directory: Path, node_id: int, pid: int | None) -> ClusterLayout:
    """Set one node's pid in cluster.json under the directory lock; returns the new layout."""
    with locked(directory):
        layout = read_cluster_json(directory)
        layout.node(node_id).pid = pid
        write_cluster_json(directory, layout)
        return layout


# ---- processes ------------------------------------------------------------------------------


def pid_cmdline(pid: int) -> list[str] | None:
    """The command line of ``pid``, or None when there is no such (non-zombie) process."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return None
    except OSError:
        raw = b""
    if raw:
        return [a.decode("utf-8", "replace") for a in raw.rstrip(b"\0").split(b"\0")]
    if Path("/proc/self/cmdline").exists():
        return None  # a zombie or kernel thread: nothing of ours is running there
    try:  # no procfs (macOS): fall back to psutil when installed
        import psutil

        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        return cast(list[str], p.cmdline())
    except Exception:
        return None


def pid_owned(pid: int | None, config_path: str) -> bool:
    """True when ``pid`` is alive and its command line names ``config_path``."""
    if not pid or pid <= 0:
        return False
    cmdline = pid_cmdline(pid)
    return cmdline is not None and config_path in cmdline


def node_alive(node: Node) -> bool:
    """True when the pid recorded for ``node`` is still that node's process."""
    return pid_owned(node.pid, node.config)


def node_command(node: Node) -> list[str]:
    """The command line that runs ``node``."""
    return [sys.executable, "-m", "tools.cli", node.role, "--config", node.config]


def start_node(node: Node) -> subprocess.Popen[bytes]:
    """Start ``node`` detached (own session) with stdout+stderr appended to its node.log."""
    log_path = Path(node.log_file)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(PROJECT_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env.setdefault("PYTHONUNBUFFERED", "1")
    with open(log_path, "ab") as log:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        log.write(f"==== kraft cluster: starting {node.name} at {stamp} ====\n".encode())
        log.flush()
        proc = subprocess.Popen(
            node_command(node),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            cwd=str(log_path.parent),
            close_fds=True,
        )
    node.pid = proc.pid
    return proc


def log_tail(node: Node, lines: int = 15) -> str:
    """The last ``lines`` lines of a node's log (empty if none)."""
    try:
        with open(node.log_file, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def reap(children: dict[int, subprocess.Popen[bytes]]) -> None:
    """Collect exit statuses of our own exited children so they do not linger as zombies."""
    for proc in children.values():
        proc.poll()


@dataclass
class StopResult:
    node: Node
    outcome: str  # "stopped", "killed", "not running", "still running"
    pid: int | None


def signal_node(node: Node, sig: int) -> bool:
    """Send ``sig`` to ``node`` if its pid is still ours; False when it is not running."""
    if not node_alive(node):
        return False
    try:
        os.kill(cast(int, node.pid), sig)  # node_alive: it has a pid
    except ProcessLookupError:
        return False
    return True


def stop_nodes(
    nodes: list[Node], timeout: float, children: dict[int, subprocess.Popen[bytes]] | None = None
) -> list[StopResult]:
    """SIGTERM ``nodes``, wait up to ``timeout`` s for them to exit, SIGKILL stragglers."""
    children = children or {}
    results: dict[int, StopResult] = {}
    waiting: list[Node] = []
    for n in nodes:
        if signal_node(n, signal.SIGTERM):
            waiting.append(n)
        else:
            results[n.id] = StopResult(n, "not running", n.pid)

    def all_gone() -> bool:
        reap(children)
        return not any(node_alive(n) for n in waiting)

    wait_until(all_gone, timeout)
    killed: list[Node] = []
    for n in waiting:
        if signal_node(n, signal.SIGKILL):
            killed.append(n)
            results[n.id] = StopResult(n, "killed", n.pid)
        else:
            results[n.id] = StopResult(n, "stopped", n.pid)

    def killed_gone() -> bool:
        reap(children)
        return not any(node_alive(n) for n in killed)

    if killed and not wait_until(killed_gone, 5.0):
        for n in killed:
            if node_alive(n):
                results[n.id] = StopResult(n, "still running", n.pid)
    return [results[n.id] for n in nodes]


def stop_cluster(
    layout: ClusterLayout,
    timeout: float,
    children: dict[int, subprocess.Popen[bytes]] | None = None,
) -> list[StopResult]:
    """Brokers first (they shut down through the controllers), then the controllers."""
    return stop_nodes(list(layout.brokers), timeout, children) + stop_nodes(
        list(layout.controllers), timeout, children
    )


def running_nodes(layout: ClusterLayout) -> list[Node]:
    """The nodes of ``layout`` whose recorded pid is still theirs."""
    return [n for n in layout.nodes() if node_alive(n)]


# ---- readiness ------------------------------------------------------------------------------


@dataclass
class Readiness:
    """What the controllers report while a cluster comes up."""

    leader_id: int = -1
    term: int = -1
    controllers_with_leader: set[int] = field(default_factory=set)
    unfenced: set[int] = field(default_factory=set)
    required_controllers: set[int] = field(default_factory=set)  # empty: any one will do
    required_brokers: set[int] = field(default_factory=set)
    last_error: str = ""

    @property
    def ready(self) -> bool:
        if self.required_controllers:
            quorum_ok = self.required_controllers <= self.controllers_with_leader
        else:
            quorum_ok = bool(self.controllers_with_leader)
        return quorum_ok and self.required_brokers <= self.unfenced

    def summary(self) -> str:
        leader = (
            f"leader {self.leader_id} (term {self.term})"
            if self.leader_id >= 0
            else "no leader yet"
        )
        text = f"quorum: {leader}"
        if self.required_controllers:
            text += (
                f", {len(self.required_controllers & self.controllers_with_leader)}/"
                f"{len(self.required_controllers)} restarted controllers joined"
            )
        if self.required_brokers:
            text += (
                f"; brokers unfenced: {len(self.required_brokers & self.unfenced)}/"
                f"{len(self.required_brokers)}"
            )
        return text


RpcCall = Callable[[list[tuple[str, int]], str, dict[str, Any], float], dict[str, Any]]


def _default_call(
    bootstrap: list[tuple[str, int]], api: str, body: dict[str, Any], timeout: float
) -> dict[str, Any]:
    from kraft.rpc.client import call_sync

    return call_sync(bootstrap, api, body, timeout)


def _authenticated_call(credentials: ClientCredentials) -> RpcCall:
    from kraft.rpc.client import call_sync

    def call(
        bootstrap: list[tuple[str, int]], api: str, body: dict[str, Any], timeout: float
    ) -> dict[str, Any]:
        return call_sync(bootstrap, api, body, timeout, credentials=credentials)

    return call


def probe(
    layout: ClusterLayout, state: Readiness, call: RpcCall | None = None, timeout: float = 0.5
) -> Readiness:
    """Ask each controller for its quorum view and, when brokers matter, for the brokers."""
    if call is None:
        creds = admin_credentials(layout)
        call = _default_call if creds is None else _authenticated_call(creds)
    for c in layout.controllers:
        try:
            q = call([(c.host, c.rpc_port)], "DescribeQuorum", {}, timeout)
        except Exception as e:  # not up yet: connection refused, timeout, not ready
            state.last_error = f"{c.name}: {e}"
            continue
        if q.get("leader_id", -1) >= 0:
            state.controllers_with_leader.add(c.id)
            if q.get("term", -1) >= state.term:
                state.leader_id, state.term = q["leader_id"], q.get("term", -1)
    if state.required_brokers and state.controllers_with_leader:
        try:
            d = call(layout.controller_endpoints(), "DescribeCluster", {}, timeout)
            state.unfenced = {
                b["broker_id"] for b in d.get("brokers", []) if b.get("state") == "unfenced"
            }
        except Exception as e:
            state.last_error = f"DescribeCluster: {e}"
    return state


def wait_ready(
    layout: ClusterLayout,
    timeout: float,
    children: dict[int, subprocess.Popen[bytes]],
    progress: Callable[[Readiness, float], None] = lambda r, t: None,
    required_controllers: set[int] | None = None,
    required_brokers: set[int] | None = None,
    call: RpcCall | None = None,
    interval: float = 0.2,
) -> Readiness:
    """Poll until a controller reports a leader and the required brokers are unfenced.

    Raises ClusterError when a node we started exits (with the tail of its log) or when
    ``timeout`` seconds pass.
    """
    start = time.monotonic()
    deadline = start + timeout
    nodes = {n.id: n for n in layout.nodes()}
    while True:
        for node_id, proc in children.items():
            rc = proc.poll()
            if rc is not None:
                node = nodes[node_id]
                tail = log_tail(node)
                raise ClusterError(
                    f"{node.name} exited with code {rc} while the cluster was "
                    f"starting; see {node.log_file}" + (f"\n{tail}" if tail else "")
                )
        state = probe(
            layout,
            Readiness(
                required_controllers=set(required_controllers or ()),
                required_brokers=set(required_brokers or ()),
            ),
            call,
        )
        progress(state, time.monotonic() - start)
        if state.ready:
            return state
        if time.monotonic() >= deadline:
            detail = f" (last error: {state.last_error})" if state.last_error else ""
            raise ClusterError(f"cluster not ready after {timeout:g}s: {state.summary()}{detail}")
        time.sleep(interval)
