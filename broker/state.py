"""Broker state for operators: a JSON-line endpoint on ``broker.admin.port``.

Protocol (plain TCP, independent of Kafka's): the client sends one line of JSON
``{"api": "DescribeBroker"}`` and receives one line of JSON, then the server closes::

    {"broker_id", "cluster_id", "state", "incarnation_id", "broker_epoch",
     "last_applied_offset", "high_watermark", "image_checksum", "controller_id",
     "listener": "host:port", "partitions": [{"topic", "topic_id", "partition", "role",
     "leader", "leader_epoch", "partition_epoch", "isr", "replicas", "high_watermark",
     "log_start_offset", "log_end_offset", "dir"}],
     "image_mismatch": null | {"offset", "checksum", "controller_checksum", "controller_id",
     "fenced"}}

``{"api": "DescribePublishes"}`` answers ``{"publishes": [[offset, unix_s], ...]}``: when each of
the latest 4,096 metadata publishes happened (the image offset it reached), so a bench measures
commit -> applied from the batches' timestamps without polling. An unknown api gets
``{"error": "..."}``. :func:`describe` is the client (used by
``kraft broker-state``); :func:`snapshot_state` builds the dict inside the broker.

The endpoint binds to loopback (:func:`admin_host`: ``broker.admin.host``, else the first
listener's address when that is a loopback one, else 127.0.0.1). When the broker authenticates
its Kafka clients (a SASL listener), a request must also carry ``"username"`` and
``"password"`` of a user of ``sasl.plain.users.file``; otherwise it gets
``{"error": "authentication required ..."}`` or ``{"error": "authentication failed"}``.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable
from typing import Any, cast

import trio

from kraft.config import is_loopback
from kraft.rpc.auth import ClientCredentials, CredentialStore

log = logging.getLogger(__name__)
MAX_LINE = 64 * 1024


def admin_host(configured: str, first_listener_host: str) -> str:
    """Where the admin endpoint binds: ``broker.admin.host`` when set, else the first
    listener's host if it is a loopback address, else 127.0.0.1 (never all interfaces)."""
    if configured:
        return configured
    return first_listener_host if is_loopback(first_listener_host) else "127.0.0.1"


def _refusal(req: Any, users: CredentialStore | None) -> str:
    """Why a request is refused ('' = serve it)."""
    if users is None:
        return ""
    name, password = req.get("username"), req.get("password")
    if not isinstance(name, str) or not isinstance(password, str) or not name or not password:
        return (
            "authentication required: this broker authenticates its clients, so send "
            '"username" and "password" of a sasl.plain.users.file user'
        )
    if users.verify(name, password) is None:
        log.warning("broker admin endpoint: authentication failed for user %r", name[:64])
        return "authentication failed"
    return ""


def snapshot_state(broker: Any) -> dict[str, Any]:
    """The state dict of a running :class:`broker.node.BrokerNode`."""
    image = broker.loader.image
    return {
        "broker_id": broker.config.node_id,
        "cluster_id": broker.config.cluster_id,
        "state": broker.lifecycle.state.value,
        "incarnation_id": broker.lifecycle.incarnation_id,
        "broker_epoch": broker.lifecycle.broker_epoch,
        "last_applied_offset": image.offset,
        "high_watermark": broker.loader.high_watermark,
        "image_checksum": broker.image_checksum(),
        "controller_id": image.controller_id,
        "listener": f"{broker.advertised_host}:{broker.kafka_port}",
        "partitions": broker.replica_manager.describe(),
        "log_dirs": broker.replica_manager.dirs.describe(),
        "offline_partitions": len(broker.replica_manager.offline),
        "image_mismatch": broker.loader.image_mismatch(),
    }


async def serve_state(
    host: str,
    port: int,
    state: Callable[[], dict[str, Any]],
    *,
    users: CredentialStore | None = None,
    publishes: Callable[[], list[list[float]]] | None = None,
    task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the JSON-line endpoint until cancelled; ``task_status`` gets the bound port.
    ``publishes``: the answer to ``DescribePublishes``."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    log.info(
        "broker admin (state) endpoint on %s:%d (%s)",
        host,
        bound,
        "authenticated" if users is not None else "no authentication",
    )
    task_status.started(bound)

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            buf = b""
            with trio.move_on_after(10):
                while b"\n" not in buf and len(buf) < MAX_LINE:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        break
                    buf += chunk
            try:
                req = json.loads(buf.split(b"\n", 1)[0] or b"{}")
                api = req.get("api", "DescribeBroker") if isinstance(req, dict) else None
            except ValueError:
                req, api = {}, None
            refusal = _refusal(req, users) if api in ("DescribeBroker", "DescribePublishes") else ""
            out: dict[str, Any]
            if refusal:
                out = {"error": refusal}
            elif api == "DescribeBroker":
                out = state()
            elif api == "DescribePublishes" and publishes is not None:
                out = {"publishes": publishes()}
            else:
                out = {
                    "error": f'unsupported request {buf[:100]!r}; send {{"api": "DescribeBroker"}}'
                }
            try:
                await stream.send_all(json.dumps(out).encode() + b"\n")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    await trio.serve_listeners(handle, listeners)


def describe(
    host: str,
    port: int,
    timeout: float = 5.0,
    credentials: ClientCredentials | None = None,
    api: str = "DescribeBroker",
) -> dict[str, Any]:
    """Ask a broker's admin endpoint for its state (or ``api``'s answer; blocking). Raises
    OSError/ValueError."""
    req: dict[str, str] = {"api": api}
    if credentials is not None:
        req.update(username=credentials.username, password=credentials.password)
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(json.dumps(req).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    return cast(dict[str, Any], json.loads(buf))
