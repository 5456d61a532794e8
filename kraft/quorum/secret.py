"""Naming the controller whose Raft frames do not decrypt with our secret.

A controller holding a different ``controller.raft.secret.file`` than its peers can join no
quorum: every frame it sends fails Fernet's check (``InvalidToken``) and its connections are
dropped, twice a second. Instead of an anonymous warning each time, :func:`report_unreadable`
logs one ERROR per peer that names it and the setting to check, then stays quiet about it (DEBUG).
An outgoing connection is named by the Raft address we dialed (the partner's
``controller.quorum.raft.voters`` entry); an incoming one by its source host and the partners
configured on that host (one, when every host runs one controller).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from cryptography.fernet import InvalidToken
from pysyncobj.tcp_connection import TcpConnection

log = logging.getLogger("kraft.quorum.raft")
HINT = "check controller.raft.secret.file: it must hold the same secret on every controller"

_reported: set[str] = set()
_lock = threading.Lock()
_connect = TcpConnection.connect


def _connect_and_remember(conn: Any, host: str, port: int) -> Any:
    """``TcpConnection.connect``, remembering which peer address this connection dials."""
    conn.kraft_dialed = f"{host}:{port}"
    return _connect(conn, host, port)


TcpConnection.connect = _connect_and_remember


def _partners(conn: Any) -> list[str]:
    """The Raft addresses of the transport's partners (from the connection's callback, which
    PySyncObj binds to its transport); empty if that cannot be found."""
    callback = getattr(conn, "_TcpConnection__onMessageReceived", None)
    transport = getattr(getattr(callback, "func", None), "__self__", None)
    nodes = getattr(transport, "_nodes", ())
    return sorted(str(n.address) for n in nodes if getattr(n, "address", None))


def peer_of(conn: Any) -> str:
    """The peer a connection is with: the Raft address we dialed; for an incoming connection
    its source host, and the partners on that host."""
    dialed = getattr(conn, "kraft_dialed", None)
    if dialed:
        return str(dialed)
    sock = getattr(conn, "_TcpConnection__socket", None)
    try:
        host = sock.getpeername()[0] if sock is not None else "?"
    except OSError:
        host = "?"
    on_host = [a for a in _partners(conn) if a.rpartition(":")[0] == host]
    if on_host:
        return f"a connection from {host} (the host of Raft peer {' or '.join(on_host)})"
    return f"a connection from {host}"


def report_unreadable(conn: Any, exc: BaseException) -> None:
    """Log why a Raft frame was dropped; a frame that does not decrypt names the peer once."""
    if not isinstance(exc, InvalidToken):
        log.warning("raft: closing a connection that sent an unreadable frame: %r", exc)
        return
    peer = peer_of(conn)
    with _lock:
        first = peer not in _reported
        _reported.add(peer)
    if first:
        log.error(
            "raft: frames from %s do not decrypt with this controller's Raft secret; %s "
            "(further failures from it are logged at DEBUG)",
            peer,
            HINT,
        )
    else:
        log.debug("raft: %s: undecryptable frame dropped (%s)", peer, HINT)
