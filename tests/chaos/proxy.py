"""A loopback TCP proxy that can be cut or stalled, and the per-pair Raft mesh built from them.

:class:`Proxy` forwards every connection accepted on its port to one target. ``cut()`` closes the
live connections and closes each new one right after accepting it (the peer sees a reset/EOF, as
after a network partition with RSTs); ``stall()`` keeps connections open but stops moving bytes
(a silent partition: the peer only notices by timeout); ``heal()`` restores forwarding.

PySyncObj pairs nodes by address string: for each pair only the node whose own address sorts
higher dials, and it announces its own address, which the other node must find in its partner
list. :class:`RaftMesh` therefore gives each pair one proxy, listed only in the *dialer's*
config (the acceptor lists the dialer by its real address, which is what the dialer announces),
and binds proxies to ports below the node ports so a proxy address always sorts below the
dialer's own address (the dialer keeps dialing through it): node ports are 20000-32767
(``tools.free_ports``) or, where the OS picks them, 32768+; proxies are 10000-19999.
"""

from __future__ import annotations

import random
import socket
import threading
from dataclasses import dataclass, field

HOST = "127.0.0.1"
# Below the launcher's node ports (tools.free_ports: 20000 up to the ephemeral range, 32768+).
PROXY_PORT_RANGE = (10000, 20000)


def bind_low_port(rng: random.Random, attempts: int = 200) -> socket.socket:
    """A listening socket on a free port in :data:`PROXY_PORT_RANGE` (5 digits, like node ports)."""
    for _ in range(attempts):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind((HOST, rng.randrange(*PROXY_PORT_RANGE)))
        except OSError:
            s.close()
            continue
        s.listen(64)
        return s
    raise OSError(f"no free proxy port in {PROXY_PORT_RANGE} after {attempts} attempts")


class Proxy:
    """Forward connections on ``listen_port`` to ``target``; cut, stall or heal on demand."""

    OPEN, CUT, STALLED = "open", "cut", "stalled"

    def __init__(self, target: tuple[str, int], listener: socket.socket, name: str = "") -> None:
        self.target = target
        self.name = name or f"proxy->{target[1]}"
        self._listener = listener
        self.port: int = listener.getsockname()[1]
        self.mode = self.OPEN
        self._lock = threading.Lock()
        self._flowing = threading.Event()
        self._flowing.set()
        self._conns: set[socket.socket] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, name=self.name, daemon=True)

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def start(self) -> Proxy:
        self._thread.start()
        return self

    def cut(self) -> None:
        """Drop every live connection and refuse (accept-and-close) new ones until healed."""
        with self._lock:
            self.mode = self.CUT
            conns, self._conns = self._conns, set()
        self._flowing.set()  # stalled pumps wake up, see CUT and exit
        for c in conns:
            _close(c)

    def stall(self) -> None:
        """Keep connections open but stop forwarding bytes until healed."""
        with self._lock:
            self.mode = self.STALLED
            self._flowing.clear()

    def heal(self) -> None:
        with self._lock:
            self.mode = self.OPEN
            self._flowing.set()

    def close(self) -> None:
        self._closed = True
        self.cut()
        _close(self._listener)
        self._thread.join(5)

    # ---- threads ------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        self._listener.settimeout(0.2)
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.mode == self.CUT:
                _close(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=2.0)
            except OSError:
                _close(client)
                continue
            for s in (client, upstream):
                s.settimeout(None)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self.mode == self.CUT:
                    _close(client)
                    _close(upstream)
                    continue
                self._conns.update((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(
                    target=self._pump, args=(src, dst), daemon=True, name=f"{self.name}-pump"
                ).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                self._flowing.wait()
                if self.mode == self.CUT:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._conns.discard(src)
                self._conns.discard(dst)
            _close(src)
            _close(dst)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()


@dataclass
class RaftMesh:
    """One proxy per pair of controllers on the Raft port; cut pairs or isolate a node."""

    real: dict[int, tuple[str, int]]  # node id -> its own Raft address
    proxies: dict[frozenset[int], Proxy] = field(default_factory=dict)
    dialer: dict[frozenset[int], int] = field(default_factory=dict)

    @classmethod
    def build(cls, real: dict[int, tuple[str, int]], rng: random.Random) -> RaftMesh:
        mesh = cls(dict(real))
        ids = sorted(real)
        for i, a in enumerate(ids):
            for b in ids[i + 1 :]:
                pair = frozenset((a, b))
                dialer, acceptor = (a, b) if _addr(real[a]) > _addr(real[b]) else (b, a)
                proxy = Proxy(real[acceptor], bind_low_port(rng), name=f"raft-{dialer}->{acceptor}")
                if not proxy.address < _addr(real[dialer]):
                    raise ValueError(f"proxy {proxy.address} must sort below {_addr(real[dialer])}")
                mesh.proxies[pair] = proxy.start()
                mesh.dialer[pair] = dialer
        return mesh

    def voters_for(self, node_id: int) -> str:
        """``controller.quorum.raft.voters`` for ``node_id``: itself real, peers it dials proxied."""
        parts = []
        for peer, addr in sorted(self.real.items()):
            pair = frozenset((node_id, peer))
            if peer != node_id and self.dialer[pair] == node_id:
                parts.append(f"{peer}@{self.proxies[pair].address}")
            else:
                parts.append(f"{peer}@{_addr(addr)}")
        return ",".join(parts)

    def isolate(self, node_id: int, stall: bool = False) -> None:
        for pair, proxy in self.proxies.items():
            if node_id in pair:
                proxy.stall() if stall else proxy.cut()

    def cut(self, a: int, b: int) -> None:
        self.proxies[frozenset((a, b))].cut()

    def heal(self) -> None:
        for proxy in self.proxies.values():
            proxy.heal()

    def close(self) -> None:
        for proxy in self.proxies.values():
            proxy.close()


def _addr(hp: tuple[str, int]) -> str:
    return f"{hp[0]}:{hp[1]}"
