"""systemd's readiness protocol (``Type=notify``): tell the service manager we are ready.

systemd passes a unix datagram socket in ``NOTIFY_SOCKET`` (a path, or ``@name`` for the
abstract namespace); a service sends it ``READY=1`` once it serves, ``STOPPING=1`` when it
begins a clean stop. Without ``NOTIFY_SOCKET`` (not run by systemd) nothing is sent. A failure
to send is logged, never raised: readiness reporting must not stop a node.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)


def notify(state: str, env: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (e.g. ``"READY=1"``) to ``NOTIFY_SOCKET``; whether it was sent."""
    path = (os.environ if env is None else env).get("NOTIFY_SOCKET", "")
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(address)
            s.sendall(state.encode("utf-8"))
    except OSError as e:
        log.warning("cannot notify systemd (NOTIFY_SOCKET=%s): %s", path, e)
        return False
    return True
