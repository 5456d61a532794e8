"""Produce and fetch with real clients against 3 controllers + 3 brokers on loopback: kcat,
confluent-kafka (zstd and LZ4 batches, stored as sent) and kafka-python move 10,000 messages each through a
3-partition RF-3 topic with acks=all and read them back exactly (assign mode); ListOffsets by
time; a batch with a bad CRC is refused with CORRUPT_MESSAGE and nothing is appended; every
replica ends with byte-identical logs. Replication: a stalled follower leaves the ISR
(AlterPartition, reason isr-shrink) and rejoins (isr-expand); killing the leader (kill -9) while an
acks=all producer runs loses no acknowledged message, and the old leader comes back, truncates,
catches up and re-enters the ISR."""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest

from broker.state import describe as describe_broker
from tests.harness import LocalCluster, kraft, kraft_json, poll

pytestmark = pytest.mark.integration
N = 10_000
BROKER_OVERRIDES = {"replica.lag.time.max.ms": "3000", "replica.fetch.wait.max.ms": "200"}


# ---- helpers shared with test_replication -------------------------------------------------------


def start_cluster(
    directory: Path, overrides: dict[str, str] = BROKER_OVERRIDES, *extra: str
) -> LocalCluster:
    """3 controllers + 3 brokers (``extra``: more ``kraft cluster up`` flags); the brokers are
    restarted once with ``overrides`` added."""
    c = LocalCluster(directory).up(3, 3, "--fsync", "never", *extra)
    for b in c.meta["brokers"]:
        c.kill(b["id"], "TERM")
        with open(b["config"], "a") as f:
            f.writelines(f"{k}={v}\n" for k, v in overrides.items())
    c.start()
    for b in c.meta["brokers"]:
        poll(lambda: broker_state(b)["state"] == "RUNNING", 60, what=f"broker {b['id']} RUNNING")
    return c


def broker_state(b: dict) -> dict:
    return describe_broker(b["host"], b["admin_port"], timeout=5.0)


def bootstrap(c: LocalCluster) -> str:
    return ",".join(f"{b['host']}:{b['port']}" for b in c.meta["brokers"])


def create_topic(c: LocalCluster, name: str, partitions: int = 3, rf: int = 3) -> None:
    kraft(
        "topics",
        "create",
        name,
        "--partitions",
        str(partitions),
        "--replication-factor",
        str(rf),
        "--cluster",
        str(c.dir),
    )
    poll(
        lambda: all(
            len([p for p in broker_state(b)["partitions"] if p["topic"] == name]) == partitions
            for b in c.meta["brokers"]
        ),
        30,
        what=f"{name} on every broker",
    )


def partition_dir(b: dict, topic: str, pid: int) -> Path:
    return next(
        Path(d) / f"{topic}-{pid}"
        for d in b["log_dirs"].split(",")
        if (Path(d) / f"{topic}-{pid}").is_dir()
    )


def log_bytes(b: dict, topic: str, pid: int) -> bytes:
    d = partition_dir(b, topic, pid)
    return b"".join(p.read_bytes() for p in sorted(d.glob("*.log")))


def replicas_identical(
    c: LocalCluster, topic: str, pid: int, brokers: list[dict] | None = None
) -> bool:
    """Every broker's log of ``topic-pid`` has the same bytes (offsets, epochs and records)."""
    return len({log_bytes(b, topic, pid) for b in (brokers or c.meta["brokers"])}) == 1


def consume_all(bs: str, topic: str, partitions: int, timeout: float = 60) -> list[bytes]:
    """Every message of ``topic`` up to each partition's high watermark as of the start
    (confluent-kafka, assign mode, from the beginning)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bs, "group.id": "assign-only", "enable.auto.commit": False}
    )
    try:
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        out: list[bytes] = []
        next_offset = dict.fromkeys(range(partitions), 0)
        deadline = time.monotonic() + timeout
        while any(next_offset[p] < ends[p] for p in ends) and time.monotonic() < deadline:
            for m in consumer.consume(1000, timeout=0.5):
                assert m.error() is None, m.error()
                out.append(m.value())
                next_offset[m.partition()] = m.offset() + 1
        assert all(next_offset[p] >= ends[p] for p in ends), (next_offset, ends)
        return out
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("dataplane") / "cluster")
    try:
        yield c
    finally:
        c.down()


# ---- tests --------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_produces_and_consumes_10000(cluster):
    create_topic(cluster, "kcat")
    bs = bootstrap(cluster)
    data = "".join(f"kcat-{i}\n" for i in range(N))
    subprocess.run(
        ["kcat", "-P", "-b", bs, "-t", "kcat", "-X", "acks=all", "-X", "linger.ms=5"],
        input=data,
        text=True,
        check=True,
        timeout=120,
        capture_output=True,
    )
    out = subprocess.run(
        ["kcat", "-C", "-b", bs, "-t", "kcat", "-e", "-q", "-f", "%p %o %s\n"],
        text=True,
        check=True,
        timeout=120,
        capture_output=True,
    ).stdout.split("\n")
    rows = [line.split(" ") for line in out if line]
    assert sorted(r[2] for r in rows) == sorted(f"kcat-{i}" for i in range(N))
    for p in range(3):  # offsets are dense from 0 in each partition
        offsets = [int(r[1]) for r in rows if r[0] == str(p)]
        assert offsets == list(range(len(offsets)))
    for p in range(3):
        poll(
            lambda: replicas_identical(cluster, "kcat", p), 30, what=f"kcat-{p} replicas identical"
        )


def test_confluent_kafka_zstd_acks_all_and_offsets_for_times(cluster):
    from confluent_kafka import Consumer, Producer, TopicPartition

    create_topic(cluster, "confluent")
    bs = bootstrap(cluster)
    producer = Producer(
        {"bootstrap.servers": bs, "acks": "all", "linger.ms": 5, "compression.type": "zstd"}
    )
    acked, errors = [], []

    def on_delivery(err, msg):
        (errors if err else acked).append(err or msg.value())

    t_half = None
    for i in range(N):
        if i == N // 2:
            producer.flush(60)
            time.sleep(0.01)  # a timestamp strictly after the first half
            t_half = int(time.time() * 1000)
        producer.produce(
            "confluent", value=f"c-{i}".encode(), partition=i % 3, on_delivery=on_delivery
        )
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert errors == [] and len(acked) == N
    got = consume_all(bs, "confluent", 3)
    assert sorted(got) == sorted(f"c-{i}".encode() for i in range(N))
    consumer = Consumer({"bootstrap.servers": bs, "group.id": "assign-only"})
    try:
        found = consumer.offsets_for_times(
            [TopicPartition("confluent", p, t_half) for p in range(3)], timeout=10
        )
        # batch granularity: the answer is the first batch that reaches the time, here exactly the
        # second half's first batch (the first half was flushed before)
        assert [tp.offset for tp in found] == [
            N // 2 // 3 + (1 if p < (N // 2) % 3 else 0) for p in range(3)
        ]
        lo, hi = consumer.get_watermark_offsets(TopicPartition("confluent", 0), timeout=10)
        assert (lo, hi) == (0, len(range(0, N, 3)))
    finally:
        consumer.close()
    lz4 = Producer({"bootstrap.servers": bs, "acks": "all", "compression.type": "lz4"})
    for i in range(100):
        lz4.produce("confluent", value=b"lz4-%d" % i, partition=0)
    assert lz4.flush(30) == 0
    codecs, small_plain = set(), set()
    data = log_bytes(cluster.meta["brokers"][0], "confluent", 0)
    pos = 0
    while pos < len(data):  # the compression codec of every stored batch (attributes & 7)
        length, attributes = (
            struct.unpack_from(">i", data, pos + 8)[0],
            struct.unpack_from(">h", data, pos + 21)[0],
        )
        records = struct.unpack_from(">i", data, pos + 57)[0]
        if attributes & 7 == 0:  # librdkafka sends a batch plain when compressing grows it
            small_plain.add(records <= 4)
        else:
            codecs.add(attributes & 7)
        pos += 12 + length
    assert codecs == {3, 4}  # LZ4 and zstd, as the clients sent them
    assert small_plain <= {True}, "a plain batch too big to be librdkafka's fallback"


def test_kafka_python_produces_and_consumes(cluster):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    create_topic(cluster, "kpy")
    bs = bootstrap(cluster).split(",")
    producer = KafkaProducer(
        bootstrap_servers=bs, acks="all", linger_ms=5, enable_idempotence=False
    )
    futures = [producer.send("kpy", f"k-{i}".encode(), partition=i % 3) for i in range(N)]
    producer.flush(60)
    offsets = [f.get(timeout=60).offset for f in futures]
    producer.close()
    assert sorted(offsets[0::3]) == list(range(len(offsets[0::3])))
    consumer = KafkaConsumer(bootstrap_servers=bs, enable_auto_commit=False, group_id=None)
    try:
        tps = [TopicPartition("kpy", p) for p in range(3)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(got) < N and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got += [r.value for r in records]
        assert sorted(got) == sorted(f"k-{i}".encode() for i in range(N))
        assert consumer.end_offsets(tps) == {tp: len(range(tp.partition, N, 3)) for tp in tps}
    finally:
        consumer.close()


def _produce_v8(topic: str, pid: int, records: bytes, acks: int = -1) -> bytes:
    body = struct.pack(">hhi", -1, acks, 10_000)  # null transactional id, acks, timeout
    body += struct.pack(">i", 1) + struct.pack(">h", len(topic)) + topic.encode()
    body += struct.pack(">i", 1) + struct.pack(">ii", pid, len(records)) + records
    head = struct.pack(">hhih", 0, 8, 42, 4) + b"test"
    return struct.pack(">i", len(head) + len(body)) + head + body


def _roundtrip(host: str, port: int, frame: bytes) -> bytes:
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(frame)
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + struct.unpack_from(">i", buf)[0]:
            chunk = s.recv(65536)
            assert chunk, "connection closed"
            buf += chunk
        return buf[4:]


def test_bad_crc_is_corrupt_message_and_nothing_is_appended(cluster):
    from tests.unit.test_partition_log import make_batch

    create_topic(cluster, "crc", partitions=1)
    leader_id = poll(
        lambda: next(
            (
                b["id"]
                for b in cluster.meta["brokers"]
                for p in broker_state(b)["partitions"]
                if p["topic"] == "crc" and p["role"] == "leader"
            ),
            None,
        ),
        30,
        what="crc leader",
    )
    leader = next(b for b in cluster.meta["brokers"] if b["id"] == leader_id)
    good = make_batch([b"one", b"two"])
    resp = _roundtrip(leader["host"], leader["port"], _produce_v8("crc", 0, good))
    # correlation id, topics[1], name, partitions[1], index, error, base offset
    name_len = struct.unpack_from(">h", resp, 8)[0]
    pid, err, base = struct.unpack_from(">ihq", resp, 10 + name_len + 4)
    assert (pid, err, base) == (0, 0, 0)
    bad = bytearray(make_batch([b"three"]))
    bad[-1] ^= 0xFF  # flip a bit of the last record: the CRC no longer matches
    resp = _roundtrip(leader["host"], leader["port"], _produce_v8("crc", 0, bytes(bad)))
    pid, err, base = struct.unpack_from(">ihq", resp, 10 + name_len + 4)
    assert (pid, err, base) == (0, 2, -1)  # CORRUPT_MESSAGE
    part = next(p for p in broker_state(leader)["partitions"] if p["topic"] == "crc")
    assert part["log_end_offset"] == 2
    assert (
        subprocess.run(
            ["kcat", "-C", "-b", bootstrap(cluster), "-t", "crc", "-e", "-q", "-f", "%s\n"],
            text=True,
            check=True,
            timeout=60,
            capture_output=True,
        ).stdout
        == "one\ntwo\n"
    )


# ---- replication: ISR shrink/expand, leader failover ----------------------------------------------


def describe_partition(c: LocalCluster, topic: str, pid: int = 0) -> dict:
    return kraft_json("topics", "describe", topic, "--cluster", str(c.dir))["topics"][0][
        "partitions"
    ][pid]


def isr_changes(c: LocalCluster, topic_id: str) -> list[tuple[str, str, tuple[int, ...]]]:
    """(api, reason, new ISR) of every metadata batch that changed an ISR of ``topic_id``, read
    from the active controller's metadata log."""
    from kraft.log.metadata_log import MetadataLog
    from kraft.records import PartitionChangeRecord

    out = []
    with MetadataLog.open(c.log_dir(c.active_controller()), fsync="never") as mlog:
        for batch in mlog.read_batches(mlog.start_offset):
            for r in batch.records:
                if (
                    isinstance(r, PartitionChangeRecord)
                    and r.topic_id == topic_id
                    and r.isr is not None
                ):
                    out.append((batch.provenance.api, batch.provenance.reason, tuple(r.isr)))
    return out


def test_stalled_follower_leaves_the_isr_and_rejoins(cluster):
    from confluent_kafka import Producer

    create_topic(cluster, "shrink", partitions=1)
    part = describe_partition(cluster, "shrink")
    follower = next(b for b in part["replicas"] if b != part["leader"])
    topic_id = kraft_json("topics", "describe", "shrink", "--cluster", str(cluster.dir))["topics"][
        0
    ]["topic_id"]
    cluster.kill(follower, "STOP")
    try:
        producer = Producer({"bootstrap.servers": bootstrap(cluster), "acks": "all"})
        acked = []
        producer.produce("shrink", b"while-stalled", on_delivery=lambda err, m: acked.append(err))
        assert producer.flush(30) == 0 and acked == [None]  # completed once the ISR shrank
        assert follower not in describe_partition(cluster, "shrink")["isr"]
    finally:
        cluster.kill(follower, "CONT")
    poll(
        lambda: follower in describe_partition(cluster, "shrink")["isr"],
        60,
        what="follower back in the ISR",
    )
    changes = isr_changes(cluster, topic_id)
    out = next(i for i, (_, _, isr) in enumerate(changes) if follower not in isr)
    back = next(c for c in changes[out + 1 :] if follower in c[2])
    assert changes[out][0] == "AlterPartition" and changes[out][1].startswith("isr-shrink"), changes
    assert back[0] == "AlterPartition" and back[1].startswith("isr-expand"), changes
    poll(lambda: replicas_identical(cluster, "shrink", 0), 30, what="identical replicas")


def test_kill_leader_during_acks_all_produce_loses_nothing_acknowledged(cluster):
    from confluent_kafka import Producer

    create_topic(cluster, "failover", partitions=1)
    topic_id = kraft_json("topics", "describe", "failover", "--cluster", str(cluster.dir))[
        "topics"
    ][0]["topic_id"]
    victim = describe_partition(cluster, "failover")["leader"]
    producer = Producer(
        {
            "bootstrap.servers": bootstrap(cluster),
            "acks": "all",
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
        producer.produce("failover", f"m-{i}".encode(), on_delivery=on_delivery)
        i += 1
        producer.poll(0 if i % 50 else 0.01)
        if killed_at is None and len(acked) >= 2000:
            cluster.kill(victim, "KILL")
            killed_at = len(acked)
        if killed_at is not None and len(acked) >= killed_at + 2000:
            break
    producer.flush(60)
    assert killed_at is not None and len(acked) >= killed_at + 2000, (
        killed_at,
        len(acked),
        failed[:3],
    )
    after = describe_partition(cluster, "failover")
    assert after["leader"] not in (victim, -1) and victim not in after["isr"]
    got = consume_all(bootstrap(cluster), "failover", 1)
    assert set(acked) <= set(got)  # every acknowledged message survived the failover
    cluster.start(victim)
    poll(
        lambda: victim in describe_partition(cluster, "failover")["isr"],
        60,
        what="old leader back in the ISR",
    )
    rejoin = [c for c in isr_changes(cluster, topic_id) if victim in c[2]][-1]
    assert rejoin[0] == "AlterPartition" and rejoin[1].startswith("isr-expand"), rejoin
    poll(
        lambda: replicas_identical(cluster, "failover", 0),
        30,
        what="the old leader truncated and caught up",
    )
