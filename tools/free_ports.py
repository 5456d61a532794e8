"""Free TCP ports for local nodes, chosen where nothing else on the machine will take them.

Asking the OS for port 0 hands out a port from the kernel's ephemeral range, the same range
every outgoing connection's local port comes from: on a busy machine a connection may take
the port between the moment it is chosen and the moment the node binds it (a node then dies
with "address in use"). Ports are therefore drawn at random *below* the ephemeral range, and
each one handed out is reserved for a while in a small file shared by every launcher of this
user, so that two clusters started at the same time do not draw the same port either.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL = (32768, 60999)  # Linux's default ip_local_port_range
LOWEST_PORT = 20000  # below: registered services, and the chaos harness's proxies (10000-19999)
MIN_POOL = 2000  # a smaller pool outside the ephemeral range is not worth drawing from
RESERVATION_S = 120.0  # how long a port handed out stays reserved for its launcher


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (inclusive); Linux's default when unreadable."""
    try:
        low, high = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return low, high


def pool(ephemeral: tuple[int, int]) -> range | None:
    """Where to draw ports from (pure): below the ephemeral range, else above it; None when
    neither side leaves ``MIN_POOL`` ports."""
    low, high = ephemeral
    if low - LOWEST_PORT >= MIN_POOL:
        return range(LOWEST_PORT, low)
    if 65535 - high >= MIN_POOL:
        return range(high + 1, 65536)
    return None


def reservations_file() -> Path:
    return Path(tempfile.gettempdir()) / f"pykraft-ports-{os.getuid()}.json"


@contextlib.contextmanager
def _reservations(path: Path, now: float) -> Iterator[dict[int, float]]:
    """The live reservations (port -> expiry, wall clock), locked against other launchers;
    written back on exit. A missing or unreadable file counts as no reservations."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    with os.fdopen(fd, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            try:
                raw = json.loads(f.read() or "{}")
                held = {int(p): float(t) for p, t in raw.items() if float(t) > now}
            except (ValueError, TypeError, AttributeError):
                held = {}
            yield held
            f.seek(0)
            f.truncate()
            f.write(json.dumps({str(p): t for p, t in sorted(held.items())}))
            f.flush()
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _bind(host: str, port: int) -> socket.socket | None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((host, port))
    except OSError:
        s.close()
        return None
    return s


def pick_free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports that can be bound on ``host`` now, outside the ephemeral range
    and not handed out to another launcher in the last ``RESERVATION_S`` seconds.

    Every probe socket stays bound until all are chosen, so the ports are distinct. Where the
    machine leaves no room outside the ephemeral range, the OS chooses (port 0).
    """
    draw_from = pool(ephemeral_range())
    rng = random.SystemRandom()
    probes: list[socket.socket] = []
    now = time.time()
    try:
        with _reservations(reservations_file(), now) as held:
            attempts = 0
            while draw_from is not None and len(probes) < count and attempts < 100 * count:
                attempts += 1
                port = rng.choice(draw_from)
                if port in held:
                    continue
                probe = _bind(host, port)
                if probe is not None:
                    probes.append(probe)
                    held[port] = now + RESERVATION_S
            while len(probes) < count:  # no room outside the ephemeral range
                probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                probe.bind((host, 0))
                probes.append(probe)
        return [p.getsockname()[1] for p in probes]
    finally:
        for p in probes:
            p.close()
