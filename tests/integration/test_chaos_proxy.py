"""The chaos TCP proxy: forwards, cuts (reset + refuse), stalls (hold bytes) and heals; the Raft
mesh lists each pair's proxy only in the dialer's voters, sorting below the dialer's address."""

from __future__ import annotations

import random
import socket
import threading

import pytest

from tests.chaos.proxy import Proxy, RaftMesh, bind_low_port


@pytest.fixture
def echo_server():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    def echo(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(4096):
                    conn.sendall(data)
            except OSError:
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()
    stop.set()
    t.join(5)
    srv.close()


def connect(proxy: Proxy) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    s.settimeout(5)
    return s


def test_forward_cut_heal(echo_server) -> None:
    proxy = Proxy(echo_server, bind_low_port(random.Random(1))).start()
    try:
        s = connect(proxy)
        s.sendall(b"hello")
        assert s.recv(100) == b"hello"
        proxy.cut()
        assert s.recv(100) == b""  # live connection dropped
        s2 = connect(proxy)  # new ones accepted, then closed
        assert s2.recv(100) == b""
        proxy.heal()
        s3 = connect(proxy)
        s3.sendall(b"again")
        assert s3.recv(100) == b"again"
        for c in (s, s2, s3):
            c.close()
    finally:
        proxy.close()


def test_stall_holds_bytes_until_healed(echo_server) -> None:
    proxy = Proxy(echo_server, bind_low_port(random.Random(2))).start()
    try:
        s = connect(proxy)
        proxy.stall()
        s.sendall(b"held")
        s.settimeout(0.5)
        with pytest.raises(socket.timeout):
            s.recv(100)
        proxy.heal()
        s.settimeout(5)
        assert s.recv(100) == b"held"
        s.close()
    finally:
        proxy.close()


def test_mesh_voters_follow_pysyncobj_dialing_rule() -> None:
    rng = random.Random(3)
    real = {1: ("127.0.0.1", 45001), 2: ("127.0.0.1", 39002), 3: ("127.0.0.1", 51003)}
    mesh = RaftMesh.build(real, rng)
    try:
        voters = {n: dict(v.split("@") for v in mesh.voters_for(n).split(",")) for n in real}
        for a in real:
            assert voters[a][str(a)] == f"127.0.0.1:{real[a][1]}"  # itself: real address
            for b in real:
                if a == b:
                    continue
                mine, theirs = f"127.0.0.1:{real[a][1]}", f"127.0.0.1:{real[b][1]}"
                listed = voters[a][str(b)]
                if mine > theirs:  # a dials b: through the pair's proxy, which sorts lower
                    assert listed != theirs and listed < mine
                else:  # b dials a and announces its real address
                    assert listed == theirs
    finally:
        mesh.close()
