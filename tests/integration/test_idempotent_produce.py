"""Idempotent produce with real clients against 3 controllers + 3 brokers: kafka-python 3
(idempotent by default) and confluent-kafka (default and ``enable.idempotence=true``) get
producer ids through InitProducerId; ids come from controller-allocated blocks and are never
reused after a broker restart; a retried batch is not appended twice (raw Produce v8 on the
socket); killing the leader with kill -9 while an idempotent producer runs leaves every
acknowledged message exactly once, with no gap; oversized batches get MESSAGE_TOO_LARGE."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from tests.harness import kraft, poll
from tests.integration.test_produce_fetch import (
    bootstrap,
    broker_state,
    consume_all,
    create_topic,
    describe_partition,
    start_cluster,
)
from tests.unit.test_producer_state import idem_batch

pytestmark = pytest.mark.integration
N = 2000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("idempotent") / "cluster")
    try:
        yield c
    finally:
        c.down()


def _frame(api: int, version: int, body: bytes, correlation: int = 7) -> bytes:
    head = struct.pack(">hhih", api, version, correlation, 4) + b"test"
    return struct.pack(">i", len(head) + len(body)) + head + body


def _produce_v8(topic: str, pid: int, records: bytes, acks: int = -1) -> bytes:
    body = struct.pack(">hhi", -1, acks, 10_000)
    body += struct.pack(">i", 1) + struct.pack(">h", len(topic)) + topic.encode()
    body += struct.pack(">i", 1) + struct.pack(">ii", pid, len(records)) + records
    return _frame(0, 8, body)


def _roundtrip(sock: socket.socket, frame: bytes) -> bytes:
    sock.sendall(frame)
    buf = b""
    while len(buf) < 4 or len(buf) < 4 + struct.unpack_from(">i", buf)[0]:
        chunk = sock.recv(65536)
        assert chunk, "connection closed"
        buf += chunk
    return buf[4:]


def _init_producer_id(sock: socket.socket) -> tuple[int, int, int]:
    """InitProducerId v1 (non-flexible, no transactional id): (error, producer id, epoch)."""
    resp = _roundtrip(sock, _frame(22, 1, struct.pack(">hi", -1, 60_000)))
    _, _, error, pid, epoch = struct.unpack_from(">iihqh", resp)
    return error, pid, epoch


def _produce_result(resp: bytes) -> tuple[int, int]:
    """(error code, base offset) of the only partition in a Produce v8 response."""
    pos = 4 + 4  # correlation id, topic count
    (n,) = struct.unpack_from(">h", resp, pos)
    pos += 2 + n + 4  # name, partition count
    _, error, base = struct.unpack_from(">ihq", resp, pos)
    return error, base


def _leader_addr(c, topic: str) -> tuple[str, int]:
    leader = describe_partition(c, topic)["leader"]
    b = next(b for b in c.meta["brokers"] if b["id"] == leader)
    return b["host"], b["port"]


def test_kafka_python_default_producer_is_idempotent(cluster):
    from kafka import KafkaProducer

    create_topic(cluster, "kpy-idem", partitions=3)
    producer = KafkaProducer(bootstrap_servers=bootstrap(cluster).split(","), linger_ms=5)
    futures = [producer.send("kpy-idem", f"k-{i}".encode(), partition=i % 3) for i in range(N)]
    producer.flush(60)
    offsets = [f.get(timeout=60).offset for f in futures]
    producer.close()
    for p in range(3):
        assert sorted(offsets[p::3]) == list(range(len(offsets[p::3])))
    got = consume_all(bootstrap(cluster), "kpy-idem", 3)
    assert sorted(got) == sorted(f"k-{i}".encode() for i in range(N))
    # the brokers keep producer state for the partitions they replicate
    for b in cluster.meta["brokers"]:
        parts = [p for p in broker_state(b)["partitions"] if p["topic"] == "kpy-idem"]
        assert parts and all(p["producers"] == 1 for p in parts), parts


@pytest.mark.parametrize("idempotence", [False, True])
def test_confluent_kafka_produces(cluster, idempotence):
    from confluent_kafka import Producer

    topic = f"ck-{'idem' if idempotence else 'plain'}"
    create_topic(cluster, topic, partitions=3)
    conf = {"bootstrap.servers": bootstrap(cluster), "linger.ms": 5}
    if idempotence:
        conf["enable.idempotence"] = True
    producer = Producer(conf)
    errors: list = []
    for i in range(N):
        producer.produce(topic, f"c-{i}".encode(), on_delivery=lambda e, m: e and errors.append(e))
        producer.poll(0)
    assert producer.flush(60) == 0 and not errors, errors[:3]
    got = consume_all(bootstrap(cluster), topic, 3)
    assert sorted(got) == sorted(f"c-{i}".encode() for i in range(N))


def test_producer_ids_come_from_blocks_and_survive_restart(cluster):
    b = cluster.meta["brokers"][0]
    with socket.create_connection((b["host"], b["port"]), timeout=10) as s:
        first = [_init_producer_id(s) for _ in range(3)]
    assert all(e == 0 and epoch == 0 for e, _, epoch in first), first
    ids = [pid for _, pid, _ in first]
    assert ids == [ids[0], ids[0] + 1, ids[0] + 2]  # fresh id per init, from one block
    cluster.kill(b["id"], "KILL")
    cluster.start(b["id"])
    poll(lambda: broker_state(b)["state"] == "RUNNING", 60, what="broker back")
    with socket.create_connection((b["host"], b["port"]), timeout=10) as s:
        error, pid, _ = poll(lambda: _init_producer_id(s), 30, what="InitProducerId")
    assert error == 0 and pid // 1000 > ids[-1] // 1000, (pid, ids)  # a new block: none reused
    log = kraft("log", "dump", str(cluster.controller(1)["metadata_dir"])).stdout
    assert log.count("ProducerIdsRecord") >= 2, log[-2000:]


def test_retried_batch_is_not_appended_twice_and_gaps_are_refused(cluster):
    create_topic(cluster, "raw-idem", partitions=1)
    host, port = _leader_addr(cluster, "raw-idem")
    with socket.create_connection((host, port), timeout=10) as s:
        _, pid, _ = _init_producer_id(s)
        assert _produce_result(
            _roundtrip(s, _produce_v8("raw-idem", 0, idem_batch(pid, 0, 0)))
        ) == (0, 0)
        assert _produce_result(
            _roundtrip(s, _produce_v8("raw-idem", 0, idem_batch(pid, 0, 2)))
        ) == (0, 2)
        # the retry of the first batch gets its original offset; nothing is appended
        assert _produce_result(
            _roundtrip(s, _produce_v8("raw-idem", 0, idem_batch(pid, 0, 0)))
        ) == (0, 0)
        gap = _produce_result(_roundtrip(s, _produce_v8("raw-idem", 0, idem_batch(pid, 0, 9))))
        assert gap == (45, -1)  # OUT_OF_ORDER_SEQUENCE_NUMBER
        fenced = _produce_result(_roundtrip(s, _produce_v8("raw-idem", 0, idem_batch(pid, 1, 0))))
        assert fenced == (0, 4)  # a new epoch starts at 0
        old = _produce_result(_roundtrip(s, _produce_v8("raw-idem", 0, idem_batch(pid, 0, 4))))
        assert old == (47, -1)  # INVALID_PRODUCER_EPOCH
    leader = next(b for b in cluster.meta["brokers"] if b["port"] == port)
    (part,) = [p for p in broker_state(leader)["partitions"] if p["topic"] == "raw-idem"]
    assert part["log_end_offset"] == 6


def test_oversized_batches_get_message_too_large(cluster):
    from confluent_kafka import KafkaError, Producer

    create_topic(cluster, "big", partitions=1)
    kraft(
        "configs",
        "alter",
        "--topic",
        "big",
        "--set",
        "max.message.bytes=2000",
        "--cluster",
        str(cluster.dir),
    )
    host, port = _leader_addr(cluster, "big")
    with socket.create_connection((host, port), timeout=10) as s:
        batch = idem_batch(-1, -1, -1, count=1, value=b"x" * 5000)
        resp = poll(
            lambda: (
                (r := _produce_result(_roundtrip(s, _produce_v8("big", 0, batch))))[0] == 10 and r
            ),
            30,
            what="MESSAGE_TOO_LARGE once the topic config arrived",
        )
        assert resp == (10, -1)
        assert _produce_result(_roundtrip(s, _produce_v8("big", 0, idem_batch(-1, -1, -1))))[0] == 0
    producer = Producer({"bootstrap.servers": bootstrap(cluster), "message.max.bytes": 10_000_000})
    errors: list = []
    producer.produce("big", b"y" * 5000, on_delivery=lambda e, m: errors.append(e))
    producer.flush(30)
    assert errors and errors[0].code() == KafkaError.MSG_SIZE_TOO_LARGE, errors


def test_kill_leader_mid_stream_exactly_once(cluster):
    from confluent_kafka import Producer

    create_topic(cluster, "eos", partitions=1)
    victim = describe_partition(cluster, "eos")["leader"]
    producer = Producer(
        {
            "bootstrap.servers": bootstrap(cluster),
            "enable.idempotence": True,
            "linger.ms": 2,
            "message.timeout.ms": 60000,
        }
    )
    acked: list[bytes] = []
    failed: list = []

    def on_delivery(err, msg):
        (failed if err else acked).append(err or msg.value())

    i, killed_at = 0, None
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        producer.produce("eos", f"m-{i:07d}".encode(), on_delivery=on_delivery)
        i += 1
        producer.poll(0 if i % 50 else 0.01)
        if killed_at is None and len(acked) >= 1000:
            cluster.kill(victim, "KILL")
            killed_at = len(acked)
        if killed_at is not None and len(acked) >= killed_at + 1000:
            break
    producer.flush(60)
    assert killed_at is not None and not failed, (killed_at, len(acked), failed[:3])
    got = consume_all(bootstrap(cluster), "eos", 1)
    assert len(got) == len(set(got)), "duplicates after failover"
    assert got == sorted(got) == [f"m-{j:07d}".encode() for j in range(len(got))]  # no gap
    assert set(acked) <= set(got)
    cluster.start(victim)
    poll(lambda: victim in describe_partition(cluster, "eos")["isr"], 60, what="victim back")
