"""Fuzz a live controller's RPC port (a real ``kraft controller`` process on loopback).

Random and mutated frames (mutations of valid requests: byte flips, insertions, deletions,
truncations, random field values), oversized length prefixes, slowloris connections and a
thousand idle connections: the controller never crashes or hangs, answers every frame it can
decode with a clear error (never ``UNKNOWN_SERVER_ERROR``), keeps its memory bounded and keeps
serving other clients promptly. Its Raft port gets what a process without the cluster secret can
send (random bytes, PySyncObj-shaped zlib pickles, forged tokens, huge length prefixes): nothing
is unpickled, the controller keeps leading in the same term, and memory stays bounded.
``bench/fuzz.py`` runs the same generators for longer.
"""

from __future__ import annotations

import pickle
import random
import socket
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import psutil
import pytest
from harness import ENV, REPO, poll
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kraft.errors import ErrorCode
from kraft.rpc.client import call_sync
from kraft.rpc.framing import FrameDecoder, FrameError, encode_frame

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

IO_TIMEOUT_MS = 1500
MAX_BUFFERED = 32 * 2**20  # controller.rpc.max.buffered.bytes of the fuzzed controller
FUZZ = settings(
    derandomize=True,
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

#: Valid requests the mutations start from (one per API family).
SEED_REQUESTS: list[dict[str, Any]] = [
    {"api": "ListTopics", "body": {}},
    {"api": "DescribeTopics", "body": {"names": ["fuzz-a", "fuzz-b"]}},
    {"api": "DescribeCluster", "body": {}},
    {
        "api": "DescribeConfigs",
        "body": {"resources": [{"resource_type": "broker", "resource_name": ""}]},
    },
    {
        "api": "CreateTopics",
        "request_id": "fz-1",
        "body": {
            "topics": [
                {
                    "name": "fuzz-a",
                    "num_partitions": 2,
                    "replication_factor": 1,
                    "configs": {"cleanup.policy": "compact"},
                }
            ]
        },
    },
    {
        "api": "CreatePartitions",
        "request_id": "fz-2",
        "body": {"topics": [{"name": "fuzz-a", "count": 3}]},
    },
    {"api": "DeleteTopics", "request_id": "fz-3", "body": {"names": ["fuzz-a"]}},
    {
        "api": "IncrementalAlterConfigs",
        "request_id": "fz-4",
        "body": {
            "resources": [
                {
                    "resource_type": "broker",
                    "resource_name": "",
                    "ops": [{"name": "background.threads", "op": "SET", "value": "4"}],
                }
            ]
        },
    },
    {
        "api": "ElectLeaders",
        "request_id": "fz-5",
        "body": {"election_type": "preferred", "partitions": None},
    },
    {
        "api": "BrokerRegistration",
        "request_id": "fz-6",
        "body": {
            "broker_id": 7,
            "incarnation_id": "00000000-0000-4000-8000-000000000007",
            "cluster_id": "x",
            "listeners": [{"name": "PLAINTEXT", "host": "h", "port": 1}],
            "features": [],
            "rack": None,
        },
    },
    {
        "api": "BrokerHeartbeat",
        "body": {
            "broker_id": 7,
            "broker_epoch": 1,
            "metadata_offset": 0,
            "want_fence": False,
            "want_shutdown": False,
        },
    },
    {"api": "FetchMetadata", "body": {"from_offset": 0, "max_wait_ms": 0, "max_bytes": 4096}},
    {
        "api": "FetchSnapshot",
        "body": {
            "name": "00000000000000000001-0000000001.checkpoint",
            "position": 0,
            "max_bytes": 100,
        },
    },
    {"api": "DescribeQuorum", "body": {}},
    {"api": "DescribeNode", "body": {"checksum": False}},
    {"api": "SaslAuthenticate", "body": {"mechanism": "PLAIN", "username": "a", "password": "b"}},
]


def seed_frame(index: int, correlation_id: int = 1) -> bytes:
    request = dict(
        SEED_REQUESTS[index % len(SEED_REQUESTS)],
        version=0,
        correlation_id=correlation_id,
        client_id="fuzz",
    )
    return encode_frame(request)


def mutate(data: bytes, rng: random.Random, rounds: int = 3) -> bytes:
    """A few random byte-level edits of ``data`` (flip, set, insert, delete, truncate, repeat)."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, rounds)):
        op = rng.randrange(7)
        pos = rng.randrange(len(buf) + 1)
        if op == 0 and buf:
            buf[min(pos, len(buf) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1 and buf:
            buf[min(pos, len(buf) - 1)] = rng.choice(
                [0x00, 0xFF, 0x7F, 0x80, 0xC1, 0xDD, 0xDF, 0xCF]
            )
        elif op == 2:
            buf[pos:pos] = rng.randbytes(rng.randint(1, 16))
        elif op == 3 and buf:
            del buf[pos : pos + rng.randint(1, 16)]
        elif op == 4:
            del buf[pos:]
        elif op == 5:
            buf += bytes(buf[:pos])
        else:
            payload = bytes(buf[4:])
            buf[:4] = struct.pack(">I", max(0, len(payload) + rng.randint(-8, 8)))
    return bytes(buf)


def retype(request: dict, rng: random.Random, value: Any) -> dict:
    """``request`` with one field (envelope or body, nested one level) replaced by ``value``."""
    out = dict(request)
    body = dict(out.get("body") or {})
    target = body if body and rng.random() < 0.7 else out
    key = rng.choice(sorted(target, key=str)) if target else "body"
    target[key] = value
    if target is body:
        out["body"] = body
    return out


def exchange(port: int, data: bytes, wait: float = 2.0) -> tuple[list[dict], bool]:
    """Send ``data``, half-close, and read until the server closes or ``wait`` passes.
    Returns (decoded answers, whether the server closed the connection)."""
    answers: list[dict] = []
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            return answers, True  # the server already closed it (e.g. oversized length)
        dec = FrameDecoder()
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                return answers, True
            if not chunk:
                return answers, True
            try:
                answers += dec.feed(chunk)
            except FrameError as exc:
                raise AssertionError(f"the server sent an undecodable frame: {exc}") from exc
    return answers, False


def assert_clear_errors(answers: list[dict], sent: bytes) -> None:
    for a in answers:
        assert a.get("error_code") != ErrorCode.UNKNOWN_SERVER_ERROR, (
            f"internal error for input {sent[:200]!r}: {a}"
        )


class Controller:
    """A real single-node controller process for fuzzing."""

    def __init__(self, directory: Path, extra: dict[str, str] | None = None) -> None:
        from kraft.config import write_properties
        from tools.cluster import pick_free_ports

        self.rpc_port, self.raft_port = pick_free_ports(2)
        raft_port = self.raft_port
        config = directory / "controller.properties"
        secret = directory / "raft.secret"
        secret.write_text("fuzzed-controller-raft-secret-32b\n")
        secret.chmod(0o600)
        write_properties(
            config,
            {
                "node.id": 1,
                "process.roles": "controller",
                "cluster.id": "fuzz-cluster",
                "controller.quorum.voters": f"1@127.0.0.1:{self.rpc_port}",
                "controller.quorum.raft.voters": f"1@127.0.0.1:{raft_port}",
                "metadata.log.dir": directory / "metadata",
                "metadata.log.fsync": "never",
                "controller.rpc.io.timeout.ms": IO_TIMEOUT_MS,
                "controller.rpc.max.buffered.bytes": MAX_BUFFERED,
                "controller.raft.secret.file": secret,
                # a thousand idle connections from this process, and its health checks
                "max.connections.per.ip": 1100,
                **(extra or {}),
            },
        )
        from kraft.storage.format import format_storage
        from tools.node_storage import node_storage

        format_storage(node_storage(str(config)), initial=True)
        self.log = open(directory / "node.log", "wb")  # noqa: SIM115 -- closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tools.cli", "controller", "--config", str(config)],
            cwd=REPO,
            env=ENV,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.ps = psutil.Process(self.proc.pid)
        poll(
            lambda: self.call("DescribeQuorum", {})["leader_id"] == 1,
            60,
            what="the controller to lead",
        )

    def call(self, api: str, body: dict, timeout: float = 5.0) -> dict:
        return call_sync([("127.0.0.1", self.rpc_port)], api, body, timeout)

    def rss(self) -> int:
        return self.ps.memory_info().rss

    def peak_rss(self) -> int:
        return peak_rss(self.ps.pid)

    def quorum(self) -> tuple[int, int]:
        q = self.call("DescribeQuorum", {})
        return q["leader_id"], q["term"]

    def assert_healthy(self, within: float = 10.0) -> float:
        """The process runs and a fresh client gets an answer within ``within`` s; returns it."""
        assert self.proc.poll() is None, "the controller exited"
        started = time.monotonic()
        assert "cluster_id" in self.call("DescribeCluster", {}, timeout=within)
        return time.monotonic() - started

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self.log.close()


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    c = Controller(tmp_path_factory.mktemp("fuzz-rpc"))
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def baseline_rss(controller: Controller) -> int:
    controller.assert_healthy()
    return controller.rss()


def msgpack_values() -> st.SearchStrategy[Any]:
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**63), max_value=2**64 - 1)
        | st.floats()
        | st.text(max_size=40)
        | st.binary(max_size=40)
    )
    return st.recursive(
        scalars,
        lambda kids: (
            st.lists(kids, max_size=4)
            | st.dictionaries(
                st.text(max_size=10) | st.integers(-(2**63), 2**63 - 1), kids, max_size=4
            )
        ),
        max_leaves=12,
    )


@FUZZ
@given(index=st.integers(0, len(SEED_REQUESTS) - 1), rng=st.randoms(use_true_random=False))
def test_mutated_valid_frames(controller: Controller, index: int, rng: random.Random) -> None:
    data = mutate(seed_frame(index), rng)
    answers, _ = exchange(controller.rpc_port, data)
    assert_clear_errors(answers, data)


@FUZZ
@given(
    index=st.integers(0, len(SEED_REQUESTS) - 1),
    rng=st.randoms(use_true_random=False),
    value=msgpack_values(),
)
def test_valid_frames_with_random_field_values(
    controller: Controller, index: int, rng: random.Random, value: Any
) -> None:
    request = dict(SEED_REQUESTS[index], version=0, correlation_id=5)
    data = encode_frame(retype(request, rng, value))
    answers, _ = exchange(controller.rpc_port, data)
    assert len(answers) == 1, f"no answer to {data[:200]!r}"
    assert_clear_errors(answers, data)


@FUZZ
@given(
    blob=st.binary(max_size=300)
    | st.builds(
        lambda payload: struct.pack(">I", len(payload)) + payload,
        st.binary(min_size=1, max_size=200),
    )
)
def test_random_bytes_and_random_payloads(controller: Controller, blob: bytes) -> None:
    answers, _ = exchange(controller.rpc_port, blob)
    assert_clear_errors(answers, blob)


@FUZZ
@given(values=st.lists(msgpack_values(), min_size=1, max_size=4))
def test_frames_holding_other_msgpack_values(controller: Controller, values: list) -> None:
    data = b"".join(struct.pack(">I", len(p)) + p for p in (msgpack.packb(v) for v in values))
    answers, _ = exchange(controller.rpc_port, data)
    assert_clear_errors(answers, data)


def test_after_fuzzing_the_controller_is_healthy_and_small(
    controller: Controller, baseline_rss: int
) -> None:
    # Runs after the fuzz tests above (file order): nothing leaked, still prompt.
    controller.assert_healthy()
    assert controller.rss() < baseline_rss + 64 * 2**20, (baseline_rss, controller.rss())


@pytest.mark.parametrize("length", [0, 8 * 2**20 + 1, 2**31, 2**32 - 1])
def test_oversized_and_empty_length_prefixes_close_at_once(
    controller: Controller, baseline_rss: int, length: int
) -> None:
    with socket.create_connection(("127.0.0.1", controller.rpc_port), timeout=5) as s:
        s.sendall(struct.pack(">I", length) + b"\x80" * 64)
        s.settimeout(5)
        started = time.monotonic()
        try:
            assert s.recv(10) == b""
        except ConnectionResetError:
            pass
        assert time.monotonic() - started < 10
    assert controller.rss() < baseline_rss + 64 * 2**20


def test_slowloris_connections_are_cut_and_others_served(controller: Controller) -> None:
    """Twenty connections trickle a valid frame one byte every 100 ms (it would take seconds):
    each is closed once io timeout passes, and meanwhile other clients get answers (within the
    10 s of ``assert_healthy``; a few ms when the machine is not loaded)."""
    frame = seed_frame(0) * 3
    socks = [
        socket.create_connection(("127.0.0.1", controller.rpc_port), timeout=5) for _ in range(20)
    ]
    closed: set[int] = set()
    started = time.monotonic()
    for s in socks:
        s.setblocking(False)
    step = 0
    while len(closed) < len(socks) and time.monotonic() - started < 30:
        for i, s in enumerate(socks):
            if i in closed:
                continue
            try:
                s.send(frame[step % len(frame) : step % len(frame) + 1])
                if s.recv(1) == b"":
                    closed.add(i)
            except BlockingIOError:
                pass
            except OSError:
                closed.add(i)
        step += 1
        if step % 5 == 0:
            controller.assert_healthy()
        time.sleep(0.1)  # the attacker's pace, not synchronisation
    elapsed = time.monotonic() - started
    for s in socks:
        s.close()
    assert len(closed) == len(socks), (
        f"only {len(closed)} of {len(socks)} slow connections were cut"
    )
    assert IO_TIMEOUT_MS / 1000 <= elapsed < IO_TIMEOUT_MS / 1000 + 15


def test_a_thousand_idle_connections(controller: Controller, baseline_rss: int) -> None:
    socks = []
    try:
        for i in range(1000):
            s = socket.create_connection(("127.0.0.1", controller.rpc_port), timeout=5)
            if i % 2:
                s.sendall(b"\x00\x00")  # half a length prefix
            socks.append(s)
        controller.assert_healthy()
        assert controller.rss() < baseline_rss + 128 * 2**20, (baseline_rss, controller.rss())
    finally:
        for s in socks:
            s.close()
    poll(controller.assert_healthy, 30, what="the controller to serve after the idle flood")


def test_many_large_incomplete_frames_keep_memory_bounded(
    controller: Controller, baseline_rss: int
) -> None:
    """Forty connections each start an 8 MiB frame and send 4 MiB of it (160 MiB in all): the
    controller holds at most max.buffered.bytes of them, closing the connections that go over."""
    chunk = b"\x81" * (4 * 2**20)
    socks = []
    try:
        for _ in range(40):
            s = socket.create_connection(("127.0.0.1", controller.rpc_port), timeout=10)
            socks.append(s)
            try:
                s.sendall(struct.pack(">I", 8 * 2**20) + chunk)
            except OSError:
                pass  # closed while sending: over the limit
        peak, window_end = 0, time.monotonic() + 3  # the server reads what the kernel buffered
        while time.monotonic() < window_end:
            peak = max(peak, controller.rss())
            time.sleep(0.05)  # sampling interval
        # Measured: +38 MiB with the limit, +162 MiB without it.
        assert peak < baseline_rss + MAX_BUFFERED + 48 * 2**20, (baseline_rss, peak)
        controller.assert_healthy()
        closed = 0
        for s in socks:
            s.settimeout(10)
            try:
                closed += s.recv(1) == b""
            except (TimeoutError, ConnectionResetError):
                closed += 1
        assert closed == len(socks)  # over the limit at once, the rest after the io timeout
    finally:
        for s in socks:
            s.close()


@FUZZ
@given(rng=st.randoms(use_true_random=False), value=msgpack_values())
def test_mutated_handshakes_never_reach_a_handler(
    tmp_path_factory: pytest.TempPathFactory, rng: random.Random, value: Any
) -> None:
    """Against an authenticating server (in process): mutated SaslAuthenticate frames and
    handshakes with random field values are refused or closed; no request is ever handled."""
    import threading

    import trio

    from kraft.rpc.auth import CredentialStore, hash_password
    from kraft.rpc.server import RpcServer

    users = tmp_path_factory.mktemp("users") / "users"
    users.write_text(f"alice:{hash_password('right', iterations=1000)}\n")
    handled: list[str] = []

    async def handler(api: str, body: dict, ctx: Any) -> dict:
        handled.append(api)
        return {}

    handshake = {
        "api": "SaslAuthenticate",
        "version": 0,
        "correlation_id": 1,
        "body": {"mechanism": "PLAIN", "username": "alice", "password": "wrong"},
    }
    write = seed_frame(4, correlation_id=2)
    inputs = [
        mutate(encode_frame(handshake), rng) + write,
        encode_frame(retype(handshake, rng, value)) + write,
    ]
    ready, box = threading.Event(), {}

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            server = RpcServer(
                "127.0.0.1", 0, handler, credentials=CredentialStore.load(users), io_timeout=1.0
            )
            box["port"] = await nursery.start(server.serve)
            box["stop"] = (trio.lowlevel.current_trio_token(), nursery.cancel_scope.cancel)
            ready.set()

    thread = threading.Thread(target=trio.run, args=(serve,), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        for data in inputs:
            answers, _ = exchange(box["port"], data, wait=3.0)
            assert all(a.get("error_code") for a in answers), answers
    finally:
        token, cancel = box["stop"]
        trio.from_thread.run_sync(cancel, trio_token=token)
        thread.join(10)
    assert handled == []


# ---- the Raft port, before authentication ------------------------------------------------------


def pysyncobj_frame(obj: Any) -> bytes:
    """What PySyncObj without a password sends: i32 native length | zlib(pickle)."""
    data = zlib.compress(pickle.dumps(obj))
    return struct.pack("i", len(data)) + data


def raft_input(rng: random.Random) -> bytes:
    """Something a process without the cluster secret could send to a Raft port."""
    choice = rng.random()
    if choice < 0.25:
        return rng.randbytes(rng.randint(0, 400))
    if choice < 0.5:  # PySyncObj-shaped messages, unencrypted
        message = rng.choice(
            [
                rng.randbytes(32),
                "127.0.0.1:1",
                "readonly",
                ["status"],
                {"type": "append_entries", "term": rng.randint(0, 99), "entries": []},
                {"type": "request_vote", "term": rng.randint(0, 99), "last_log_index": 9},
            ]
        )
        frame = pysyncobj_frame(message)
        return frame if rng.random() < 0.3 else mutate(frame, rng, rounds=2)
    if choice < 0.7:  # Fernet-looking tokens (version byte 0x80, timestamp, iv, junk, hmac)
        token = b"\x80" + rng.randbytes(rng.randint(8, 120))
        return struct.pack("i", len(token)) + token
    # length prefixes: negative, just over the pre-auth limit, huge; then a little data
    size = rng.choice([-1, 0, (1 << 20) + 1, 64 << 20, 2**31 - 1, rng.randint(1, 1 << 20)])
    return struct.pack("i", size) + rng.randbytes(rng.randint(0, 2000))


def send_raw(port: int, data: bytes, wait: float = 1.0) -> bool:
    """Send ``data`` and read until the server closes (True) or ``wait`` passes (False)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        try:
            s.sendall(data)
        except OSError:
            return True
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                if not s.recv(65536):
                    return True
            except TimeoutError:
                return False
            except ConnectionResetError:
                return True
    return False


def peak_rss(pid: int) -> int:
    """The process' peak resident set since it started (the kernel's ``VmHWM``), in bytes:
    unlike sampling ``rss`` it catches a spike between two samples. 0 where unknown."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class _Marker:
    """Unpickling this creates ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (open, (self.path, "w"))


RAFT_FUZZ = settings(FUZZ, max_examples=60)


@RAFT_FUZZ
@given(rng=st.randoms(use_true_random=False))
def test_raft_port_before_authentication(controller: Controller, rng: random.Random) -> None:
    send_raw(controller.raft_port, raft_input(rng), wait=0.3)


def test_after_raft_fuzzing_nothing_ran_and_the_leader_kept_its_term(
    controller: Controller, baseline_rss: int, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    before = controller.quorum()
    peak = controller.rss()
    for obj in (
        _Marker(str(marker)),
        {"type": "append_entries", "entries": [_Marker(str(marker))]},
    ):
        assert send_raw(controller.raft_port, pysyncobj_frame(obj), wait=5)
    for size in (64 << 20, 2**31 - 1):  # closed after the prefix: not read, not buffered
        assert send_raw(controller.raft_port, struct.pack("i", size) + bytes(4 << 20), wait=5)
        peak = max(peak, controller.rss())
    assert send_raw(controller.raft_port, bytes(64 << 20), wait=5)  # a 0-byte frame, then zeros
    peak = max(peak, controller.rss())
    hwm = controller.peak_rss()
    print(
        f"controller peak RSS after Raft-port fuzzing: {peak / 2**20:.1f} MB sampled, "
        f"{hwm / 2**20:.1f} MB kernel high-water mark (baseline {baseline_rss / 2**20:.1f} MB)"
    )
    assert not marker.exists()
    assert controller.quorum() == before
    assert peak < baseline_rss + 64 * 2**20, (baseline_rss, peak)
    assert hwm < baseline_rss + 64 * 2**20, (baseline_rss, hwm)  # no spike between samples
    controller.assert_healthy()
