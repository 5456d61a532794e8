"""Fuzz a live broker's Kafka listener (a real cluster: one controller, one broker, one topic).

Mutated valid requests (ApiVersions, Metadata, Produce with a real record batch, Fetch,
ListOffsets), random bytes, oversized length prefixes, slowloris and a thousand idle
connections: the broker never crashes or hangs, its memory stays bounded, and a fresh client
(from another loopback address, 127.0.0.2: ``max.connections.per.ip`` caps the attacker's one)
still gets its Metadata answered. A SASL listener gets the same before login, plus SASL requests
and length prefixes over ``sasl.server.max.receive.size``: refused unread, peak RSS reported.
``bench/fuzz.py --target kafka|kafka-preauth`` runs the same for longer.
"""

from __future__ import annotations

import random
import socket
import struct
import time
from collections.abc import Iterator

import psutil
import pytest
from crc32c import crc32c
from harness import LocalCluster, kraft, poll
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz_rpc import mutate, peak_rss
from test_kafka_listener import recv_frame as read_frame

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOPIC = "fuzz-topic"
FUZZ = settings(
    derandomize=True,
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _str(s: str | None) -> bytes:
    if s is None:
        return struct.pack(">h", -1)
    return struct.pack(">h", len(s)) + s.encode()


def _varint(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)  # zigzag
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def record_batch(values: list[bytes]) -> bytes:
    """A magic-2 record batch of ``values`` (no keys, no headers), CRC-32C included."""
    records = b""
    for i, v in enumerate(values):
        body = b"\x00" + _varint(0) + _varint(i) + _varint(-1) + _varint(len(v)) + v + _varint(0)
        records += _varint(len(body)) + body
    after_crc = (
        struct.pack(
            ">hiqqqhii",
            0,
            len(values) - 1,
            1_700_000_000_000,
            1_700_000_000_000,
            -1,
            -1,
            -1,
            len(values),
        )
        + records
    )
    tail = struct.pack(">ib", 0, 2) + struct.pack(">I", crc32c(after_crc)) + after_crc
    return struct.pack(">qi", 0, len(tail)) + tail


def request(
    api_key: int, version: int, body: bytes, correlation_id: int = 1, flexible: bool = False
) -> bytes:
    head = struct.pack(">hhi", api_key, version, correlation_id) + _str("fuzz")
    if flexible:
        head += b"\x00"
    return struct.pack(">i", len(head) + len(body)) + head + body


def seed_requests() -> list[bytes]:
    """One valid request per served API family."""
    batch = record_batch([b"hello", b"fuzz"])
    produce = (
        _str(None)
        + struct.pack(">hii", 1, 5000, 1)
        + _str(TOPIC)
        + struct.pack(">ii", 1, 0)
        + struct.pack(">i", len(batch))
        + batch
    )
    fetch = (
        struct.pack(">iiiibii", -1, 100, 1, 1 << 20, 0, 0, -1)
        + struct.pack(">i", 1)
        + _str(TOPIC)
        + struct.pack(">iiiqqi", 1, 0, -1, 0, -1, 1 << 20)
        + struct.pack(">i", 0)
        + _str("")
    )
    list_offsets = struct.pack(">ii", -1, 1) + _str(TOPIC) + struct.pack(">iiq", 1, 0, -1)
    return [
        request(18, 0, b""),
        request(18, 3, b"\x05fuzz\x021\x00", flexible=True),
        request(3, 1, struct.pack(">i", -1)),
        request(3, 4, struct.pack(">i", 1) + _str(TOPIC) + b"\x00"),
        request(0, 3, produce),
        request(1, 11, fetch),
        request(2, 1, list_offsets),
    ]


SEEDS = seed_requests()


def send_and_drain(port: int, data: bytes, wait: float = 2.0) -> None:
    """Send, half-close, read whatever comes back until close or ``wait`` seconds."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                if not s.recv(65536):
                    return
            except (TimeoutError, ConnectionResetError):
                return


class Broker:
    def __init__(self, cluster: LocalCluster) -> None:
        b = cluster.meta["brokers"][0]
        self.port = b["port"]
        self.ps = psutil.Process(b["pid"])

    def rss(self) -> int:
        return self.ps.memory_info().rss

    def peak_rss(self) -> int:
        return peak_rss(self.ps.pid)

    def assert_healthy(self, within: float = 10.0) -> None:
        """The broker runs and answers a fresh Metadata request naming the topic."""
        assert self.ps.is_running() and self.ps.status() != psutil.STATUS_ZOMBIE, (
            "the broker exited"
        )
        with socket.create_connection(
            ("127.0.0.1", self.port), timeout=within, source_address=("127.0.0.2", 0)
        ) as s:
            s.settimeout(within)
            s.sendall(request(3, 1, struct.pack(">i", -1), correlation_id=77))
            answer = read_frame(s)
        assert struct.unpack_from(">i", answer)[0] == 77 and TOPIC.encode() in answer


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    cluster = LocalCluster(tmp_path_factory.mktemp("fuzz-kafka") / "c")
    try:
        cluster.up(1, 1, "--fsync", "never")
        kraft(
            "topics",
            "create",
            TOPIC,
            "--partitions",
            "1",
            "--replication-factor",
            "1",
            "--cluster",
            str(cluster.dir),
        )
        b = Broker(cluster)
        poll(lambda: b.assert_healthy() is None, 60, what="the broker to know the topic")
        yield b
    finally:
        cluster.down()


@pytest.fixture(scope="module")
def baseline_rss(broker: Broker) -> int:
    for seed in SEEDS:  # warm up every code path once
        send_and_drain(broker.port, seed, wait=0.5)
    return broker.rss()


def test_seed_requests_are_valid(broker: Broker) -> None:
    """The mutations start from requests the broker answers (else the fuzzing proves little)."""
    for i, seed in enumerate(SEEDS):
        with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
            s.settimeout(10)
            s.sendall(seed)
            assert struct.unpack_from(">i", read_frame(s))[0] == 1, f"seed {i} not answered"


@FUZZ
@given(index=st.integers(0, len(SEEDS) - 1), rng=st.randoms(use_true_random=False))
def test_mutated_valid_requests(
    broker: Broker, baseline_rss: int, index: int, rng: random.Random
) -> None:
    send_and_drain(broker.port, mutate(SEEDS[index], rng, rounds=4), wait=1.0)


@FUZZ
@given(
    blob=st.binary(max_size=300)
    | st.builds(
        lambda payload: struct.pack(">i", len(payload)) + payload,
        st.binary(min_size=1, max_size=200),
    )
)
def test_random_bytes(broker: Broker, baseline_rss: int, blob: bytes) -> None:
    send_and_drain(broker.port, blob, wait=1.0)


def test_after_fuzzing_the_broker_is_healthy_and_small(broker: Broker, baseline_rss: int) -> None:
    broker.assert_healthy()
    assert broker.rss() < baseline_rss + 64 * 2**20, (baseline_rss, broker.rss())


@pytest.mark.parametrize("length", [-1, 0, 104_857_601, 2**31 - 1])
def test_bad_length_prefixes_close_at_once(broker: Broker, baseline_rss: int, length: int) -> None:
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
        s.sendall(struct.pack(">i", length) + b"\x00" * 64)
        s.settimeout(10)
        try:
            assert s.recv(10) == b""
        except ConnectionResetError:
            pass
    assert broker.rss() < baseline_rss + 64 * 2**20


def test_slowloris_does_not_starve_others(broker: Broker) -> None:
    """Twenty connections trickle requests a byte at a time; others are still answered."""
    socks = [socket.create_connection(("127.0.0.1", broker.port), timeout=5) for _ in range(20)]
    frame = SEEDS[2]
    try:
        for step in range(min(len(frame) - 1, 30)):
            for s in socks:
                s.sendall(frame[step : step + 1])
            if step % 10 == 0:
                broker.assert_healthy()
            time.sleep(0.05)  # the attacker's pace, not synchronisation
    finally:
        for s in socks:
            s.close()
    broker.assert_healthy()


def test_a_thousand_idle_connections(broker: Broker, baseline_rss: int) -> None:
    socks = []
    try:
        for i in range(1000):
            s = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
            if i % 2:
                s.sendall(b"\x00\x00")
            socks.append(s)
        broker.assert_healthy()
        assert broker.rss() < baseline_rss + 128 * 2**20, (baseline_rss, broker.rss())
    finally:
        for s in socks:
            s.close()
    poll(
        lambda: broker.assert_healthy() is None, 30, what="the broker to serve after the idle flood"
    )


@pytest.mark.parametrize("version", [1, 4, 9])
def test_metadata_request_with_a_null_topic_name_closes_only_that_connection(version: int) -> None:
    from test_kafka_listener import CLUSTER_ID, ListenerThread, build_image

    from broker.metadata.metadata_cache import MetadataCache

    cache = MetadataCache(CLUSTER_ID)
    listener = ListenerThread(cache)
    port = listener.start()
    cache.set_image(build_image(port))
    try:
        if version >= 9:  # compact array of one topic with a null compact name, no tags, flags
            body = b"\x02" + b"\x00" + b"\x00" + b"\x01\x00\x00\x00"
        else:
            body = struct.pack(">ih", 1, -1) + (b"\x00" if version >= 4 else b"")
        send_and_drain(port, request(3, version, body, flexible=version >= 9), wait=3.0)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.settimeout(5)
            s.sendall(request(18, 0, b"", correlation_id=9))
            assert struct.unpack_from(">i", read_frame(s))[0] == 9
    finally:
        listener.stop()


# ---- a SASL listener, before login ----------------------------------------------------------

PREAUTH_LIMIT = 524_288  # sasl.server.max.receive.size (default)


class SaslBroker(Broker):
    """The broker of a cluster whose client listener is SASL_PLAINTEXT."""

    def assert_healthy(self, within: float = 10.0) -> None:
        """The broker runs and answers ApiVersions (allowed before login) from 127.0.0.2."""
        assert self.ps.is_running() and self.ps.status() != psutil.STATUS_ZOMBIE
        with socket.create_connection(
            ("127.0.0.1", self.port), timeout=within, source_address=("127.0.0.2", 0)
        ) as s:
            s.settimeout(within)
            s.sendall(request(18, 0, b"", correlation_id=78))
            assert struct.unpack_from(">i", read_frame(s))[0] == 78


def sasl_seeds() -> list[bytes]:
    token = b"\x00fuzz\x00fuzz-pw"
    return [
        request(17, 1, _str("PLAIN")),
        request(17, 0, _str("SCRAM-SHA-512")),
        request(36, 0, struct.pack(">i", len(token)) + token),
        request(36, 2, bytes([len(token) + 1]) + token + b"\x00", flexible=True),
    ]


def preauth_input(rng: random.Random) -> bytes:
    """What a client that has not logged in could send to a SASL listener."""
    choice = rng.random()
    if choice < 0.4:
        return mutate(rng.choice(sasl_seeds()), rng, rounds=3)
    if choice < 0.6:
        return b"".join(sasl_seeds()[:1]) + mutate(rng.choice(SEEDS), rng, rounds=2)
    if choice < 0.8:  # announces more than the pre-auth limit (Kafka's 100 MiB cap and beyond)
        size = rng.choice([PREAUTH_LIMIT + 1, 100 << 20, 104_857_600, 2**31 - 1])
        return struct.pack(">i", size) + rng.randbytes(rng.randint(0, 4096))
    return rng.randbytes(rng.randint(0, 300))


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SaslBroker]:
    from kraft.rpc.auth import hash_password

    tmp = tmp_path_factory.mktemp("fuzz-sasl")
    cluster = LocalCluster(tmp / "c")
    try:
        cluster.up(1, 1, "--fsync", "never")
        users = tmp / "users"
        users.write_text(f"fuzz:{hash_password('fuzz-pw', iterations=1000)}\n")
        cluster.use_sasl_listener(101, users)
        b = SaslBroker(cluster)
        b.assert_healthy()
        yield b
    finally:
        cluster.down()


@FUZZ
@given(rng=st.randoms(use_true_random=False))
def test_frames_before_sasl_login(sasl_broker: SaslBroker, rng: random.Random) -> None:
    send_and_drain(sasl_broker.port, preauth_input(rng), wait=0.5)


def test_large_frames_before_login_are_refused_unread(sasl_broker: SaslBroker) -> None:
    base = peak = sasl_broker.rss()
    for size in (PREAUTH_LIMIT + 1, 100 << 20, 100 << 20, 100 << 20, 100 << 20, 100 << 20):
        with socket.create_connection(("127.0.0.1", sasl_broker.port), timeout=10) as s:
            s.settimeout(10)
            try:
                s.sendall(struct.pack(">i", size) + bytes(16 << 20))
                assert s.recv(1) == b""
            except (BrokenPipeError, ConnectionResetError):
                pass
        peak = max(peak, sasl_broker.rss())
    hwm = sasl_broker.peak_rss()
    print(
        f"broker peak RSS, six large pre-auth frames: {peak / 2**20:.1f} MB sampled, "
        f"{hwm / 2**20:.1f} MB kernel high-water mark (start {base / 2**20:.1f} MB)"
    )
    assert peak < base + 16 * 2**20, (base, peak)
    assert hwm < base + 16 * 2**20, (base, hwm)  # no spike between samples either
    sasl_broker.assert_healthy()
