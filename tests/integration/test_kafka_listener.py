"""The broker's Kafka listener against real clients (kafka-python, confluent-kafka, kcat) and raw
frames (pipelining, trailing bytes, unknown tags, unsupported versions, garbage)."""

from __future__ import annotations

import json
import shutil
import socket
import struct
import subprocess
import threading
import time
import uuid

import pytest
import trio

from broker.metadata.metadata_cache import MetadataCache
from broker.protocol.kafka_listener import KafkaListener
from kraft.metadata.replay import image_from_records
from kraft.records import (
    LeaderChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
)

CLUSTER_ID = "test-cluster-abc"
T1, T2 = str(uuid.uuid4()), str(uuid.uuid4())


def build_image(port: int, fenced: tuple[int, ...] = ()):
    """Three brokers (all advertising this listener), two topics, controller 3000."""
    recs = []
    for b in (1, 2, 3):
        recs.append(
            RegisterBrokerRecord(
                b,
                str(uuid.uuid4()),
                10 + b,
                (
                    {
                        "name": "PLAINTEXT",
                        "host": "127.0.0.1",
                        "port": port,
                        "security_protocol": "PLAINTEXT",
                    },
                ),
                (),
                f"rack-{b}",
                b in fenced,
                False,
            )
        )
    recs.append(TopicRecord("orders", T1))
    for p in range(3):
        replicas = (1 + p % 3, 1 + (p + 1) % 3)
        recs.append(PartitionRecord(p, T1, replicas, replicas, (), (), replicas[0], 0, 5 + p, 7))
    recs.append(TopicRecord("audit", T2))
    recs.append(PartitionRecord(0, T2, (3,), (3,), (), (), 3, 0, 0, 0))
    recs.append(LeaderChangeRecord(3000, 4))
    return image_from_records(recs, offset=len(recs) - 1)


class ListenerThread:
    """Runs a KafkaListener in a trio loop on a background thread."""

    def __init__(self, cache: MetadataCache, admin=None, replicas=None, **listener_kw) -> None:
        self.cache = cache
        self.admin = admin
        self.listener_kw = listener_kw
        self.replicas = replicas
        self.port: int | None = None
        self._token = None
        self._scope: trio.CancelScope | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as self._scope:
            async with trio.open_nursery() as nursery:
                listener = KafkaListener(
                    self.cache, "127.0.0.1", 0, admin=self.admin, **self.listener_kw
                )
                if self.replicas is not None:
                    listener.serve_data(self.replicas)
                self.port = await nursery.start(listener.serve)
                self._ready.set()

    def start(self) -> int:
        self._thread.start()
        assert self._ready.wait(10)
        return self.port

    def stop(self) -> None:
        trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
        self._thread.join(10)


@pytest.fixture()
def listener():
    cache = MetadataCache(CLUSTER_ID)
    lt = ListenerThread(cache)
    port = lt.start()
    cache.set_image(build_image(port))
    yield cache, port
    lt.stop()


# ---- raw protocol helpers ---------------------------------------------------------------------


def uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def request(api_key: int, version: int, corr: int, body: bytes, flexible: bool) -> bytes:
    head = struct.pack(">hhih", api_key, version, corr, 4) + b"test"
    if flexible:
        head += b"\x00"
    payload = head + body
    return struct.pack(">i", len(payload)) + payload


def recv_frame(sock: socket.socket) -> bytes:
    def exact(n):
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf

    (size,) = struct.unpack(">i", exact(4))
    return exact(size)


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    return s


def is_closed(sock: socket.socket) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if sock.recv(1) == b"":
                return True
        except TimeoutError:
            continue
        except ConnectionError:
            return True
    return False


# ---- real clients -----------------------------------------------------------------------------


def test_kafka_python_sees_cluster(listener):
    from kafka import KafkaAdminClient, KafkaConsumer

    cache, port = listener
    consumer = KafkaConsumer(bootstrap_servers=f"127.0.0.1:{port}")
    try:
        assert consumer.topics() == {"orders", "audit"}
        assert consumer.partitions_for_topic("orders") == {0, 1, 2}
    finally:
        consumer.close()
    admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}")
    try:
        assert sorted(admin.list_topics()) == ["audit", "orders"]
        (orders,) = admin.describe_topics(["orders"])
        assert orders["name"] == "orders" and orders["topic_id"] == T1
        parts = sorted(orders["partitions"], key=lambda p: p["partition_index"])
        assert [p["leader_id"] for p in parts] == [1, 2, 3]
        assert [p["leader_epoch"] for p in parts] == [5, 6, 7]
        assert parts[1]["replica_nodes"] == [2, 3] and parts[1]["isr_nodes"] == [2, 3]
    finally:
        admin.close()


def test_confluent_list_topics(listener):
    from confluent_kafka.admin import AdminClient

    cache, port = listener
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
    md = admin.list_topics(timeout=10)
    assert md.cluster_id == CLUSTER_ID
    assert sorted(md.brokers) == [1, 2, 3]
    assert md.brokers[2].port == port
    assert set(md.topics) == {"orders", "audit"}
    p2 = md.topics["orders"].partitions[2]
    assert (p2.leader, list(p2.replicas), list(p2.isrs)) == (3, [3, 1], [3, 1])
    assert md.controller_id == 1  # lowest alive broker, as Kafka clients cannot reach controllers


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_list(listener):
    cache, port = listener
    out = subprocess.run(
        ["kcat", "-b", f"127.0.0.1:{port}", "-L", "-J"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    md = json.loads(out.stdout)
    assert sorted(b["id"] for b in md["brokers"]) == [1, 2, 3]
    topics = {t["topic"]: t for t in md["topics"]}
    assert set(topics) == {"orders", "audit"}
    assert [p["leader"] for p in topics["orders"]["partitions"]] == [1, 2, 3]
    assert [r["id"] for r in topics["audit"]["partitions"][0]["replicas"]] == [3]


def test_fenced_broker_hidden_and_leader_unavailable(listener):
    from confluent_kafka.admin import AdminClient

    cache, port = listener
    cache.set_image(build_image(port, fenced=(3,)))
    md = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(timeout=10)
    assert sorted(md.brokers) == [1, 2]
    audit = md.topics["audit"].partitions[0]
    assert audit.leader == -1 and audit.error is not None


# ---- raw frames -------------------------------------------------------------------------------


def test_api_versions_unsupported_version_answers_v0(listener):
    _, port = listener
    with connect(port) as s:
        s.sendall(request(18, 99, 7, b"\x00garbage-body", flexible=False))
        resp = recv_frame(s)
        corr, err, n = struct.unpack_from(">ihi", resp)
        assert (corr, err) == (7, 35)
        ranges = {
            struct.unpack_from(">hhh", resp, 10 + 6 * i)[0]: struct.unpack_from(
                ">hhh", resp, 10 + 6 * i
            )[1:]
            for i in range(n)
        }
        assert ranges[18] == (0, 4) and ranges[3] == (0, 13) and ranges[10] == (0, 4)


def metadata_v12_body(topics: list[str] | None, tags: bytes = b"\x00") -> bytes:
    body = uvarint(0) if topics is None else uvarint(len(topics) + 1)
    for name in topics or []:
        body += bytes(16) + uvarint(len(name) + 1) + name.encode() + tags
    return body + b"\x00\x00" + tags  # allow_auto, include_topic_ops, tagged fields


def test_pipelined_requests_answered_in_order_with_trailing_bytes_and_unknown_tags(listener):
    _, port = listener
    unknown_tag = uvarint(1) + uvarint(42) + uvarint(3) + b"xyz"
    frames = b"".join(
        [
            request(18, 3, 1, b"\x00", flexible=True),
            request(
                3,
                12,
                2,
                metadata_v12_body(["orders"], tags=unknown_tag) + b"\x01\x02\x03",
                flexible=True,
            ),
            request(3, 1, 3, struct.pack(">i", -1), flexible=False),
            request(3, 0, 4, struct.pack(">i", 0), flexible=False),
            request(3, 12, 5, metadata_v12_body(["nope"]), flexible=True),
        ]
    )
    with connect(port) as s:
        s.sendall(frames)
        corrs = [struct.unpack_from(">i", recv_frame(s))[0] for _ in range(5)]
    assert corrs == [1, 2, 3, 4, 5]


def test_garbage_closes_only_that_connection(listener):
    _, port = listener
    good = connect(port)
    bad = connect(port)
    truncated = connect(port)
    bad.sendall(struct.pack(">i", -5) + b"junk")
    assert is_closed(bad)
    undecodable = connect(port)
    undecodable.sendall(struct.pack(">i", 9) + b"\x00\x03\x00\x0c\x00\x00\x00\x01\xff")
    assert is_closed(undecodable)
    truncated.sendall(struct.pack(">i", 100) + b"\x00\x03")
    truncated.shutdown(socket.SHUT_WR)
    assert is_closed(truncated)
    unknown_api = connect(port)
    unknown_api.sendall(request(0, 9, 1, b"", flexible=True))
    assert is_closed(unknown_api)
    good.sendall(request(18, 0, 11, b"", flexible=False))
    assert struct.unpack_from(">ih", recv_frame(good)) == (11, 0)
    for s in (good, bad, truncated, undecodable, unknown_api):
        s.close()


def test_metadata_response_cached_per_image(listener):
    cache, port = listener
    from broker.protocol.kafka_codec import MetadataRequest

    req = MetadataRequest(None, True)
    a = cache.encoded_metadata(12, req)
    assert cache.encoded_metadata(12, req) is a
    cache.set_image(build_image(port, fenced=(2,)))
    assert cache.encoded_metadata(12, req) != a


class EchoAdmin:
    """An AdminHandler for the hook test: serves DescribeCluster (API 60, flexible from v0) by
    echoing the request's client id and body length in an otherwise empty response frame."""

    def api_ranges(self) -> dict[int, tuple[int, int]]:
        return {60: (0, 1)}

    async def handle(self, header, reader, principal: str) -> bytes:
        assert principal == "User:ANONYMOUS"  # a PLAINTEXT connection
        await trio.sleep(0)
        rest = reader.data[reader.pos :]
        body = header.client_id.encode() + struct.pack(">i", len(rest))
        return struct.pack(">ii", 4 + len(body), header.correlation_id) + body


def test_admin_handler_advertised_and_dispatched():
    cache = MetadataCache(CLUSTER_ID)
    lt = ListenerThread(cache, admin=EchoAdmin())
    port = lt.start()
    try:
        with connect(port) as s:
            s.sendall(
                request(18, 0, 1, b"", flexible=False)
                + request(60, 1, 2, b"\x01\x02\x00", flexible=True)
                + request(18, 0, 3, b"", flexible=False)
            )
            resp = recv_frame(s)
            corr, err, n = struct.unpack_from(">ihi", resp)
            ranges = {
                struct.unpack_from(">hhh", resp, 10 + 6 * i)[0]: struct.unpack_from(
                    ">hhh", resp, 10 + 6 * i
                )[1:]
                for i in range(n)
            }
            assert ranges[60] == (0, 1) and ranges[18] == (0, 4)
            # header v2: the tag section after client_id was consumed, the body is 3 bytes
            assert recv_frame(s) == struct.pack(">i", 2) + b"test" + struct.pack(">i", 3)
            assert struct.unpack_from(">i", recv_frame(s))[0] == 3
            s.sendall(request(60, 2, 4, b"", flexible=True))  # beyond the handler's range
            assert is_closed(s)
    finally:
        lt.stop()


# ---- data plane: produce purgatory, long-poll fetch, per-partition errors -----------------------


class DataPlane:
    """A listener serving the data plane from broker 1's ReplicaManager: broker 1 leads orders-0
    (replicas 1, 2; ISR 1, 2; leader epoch 5), follows orders-2 and has no replica of orders-1."""

    def __init__(self, tmp_path) -> None:
        from broker.replica.replica_manager import ReplicaManager
        from kraft.metadata.image import MetadataImage

        self.image = MetadataImage.EMPTY
        self.rm = ReplicaManager(1, [tmp_path])
        self.step(*build_image(1).to_records())
        self.thread = ListenerThread(MetadataCache(CLUSTER_ID), replicas=self.rm)
        self.port = self.thread.start()
        self.corr = 0

    def step(self, *records) -> None:
        from kraft.metadata.delta import MetadataDelta

        delta = MetadataDelta(self.image)
        for r in records:
            delta.replay(r)
        self.image = delta.apply()
        self.rm.apply_delta(delta, self.image)

    def close(self) -> None:
        self.thread.stop()
        self.rm.close()

    def frame(self, api_key: int, version: int, values: dict) -> bytes:
        """A request encoded by kio (header v1 or v2 as the version needs)."""
        import io

        from kio.index import load_request_schema
        from kio.serial import entity_writer

        from broker.protocol.kafka_codec import build

        cls = load_request_schema(api_key, version)
        buf = io.BytesIO()
        entity_writer(cls)(buf, build(cls, values))
        self.corr += 1
        return request(api_key, version, self.corr, buf.getvalue(), flexible=cls.__flexible__)

    def produce(
        self,
        topic: str,
        pid: int,
        records: bytes,
        acks: int = -1,
        timeout_ms: int = 5000,
        sock=None,
    ) -> tuple[int, int]:
        """(error code, base offset) of a Produce v8."""
        import datetime

        from kio.index import load_response_schema
        from kio.serial import entity_reader

        data = self.frame(
            0,
            8,
            {
                "transactional_id": None,
                "acks": acks,
                "timeout": datetime.timedelta(milliseconds=timeout_ms),
                "topic_data": [
                    {"name": topic, "partition_data": [{"index": pid, "records": records}]}
                ],
            },
        )
        with connect(self.port) as s:
            s.settimeout(15)
            s.sendall(data)
            resp, _ = entity_reader(load_response_schema(0, 8))(recv_frame(s), 4)
        p = resp.responses[0].partition_responses[0]
        return p.error_code.value, p.base_offset

    def fetch_frame(
        self,
        replica_id: int,
        topic: str,
        pid: int,
        offset: int,
        epoch: int = -1,
        max_wait_ms: int = 0,
    ) -> bytes:
        from broker.protocol.data_codec import (
            FetchPartition,
            FetchRequest,
            frame_request,
            write_fetch_request,
        )

        self.corr += 1
        req = FetchRequest(
            replica_id,
            max_wait_ms,
            1,
            1 << 20,
            0,
            [(topic, [FetchPartition(pid, epoch, offset, 0, 1 << 20)])],
        )
        return frame_request(1, 11, self.corr, "t", write_fetch_request(req))

    @staticmethod
    def fetch_result(frame: bytes):
        from broker.protocol.data_codec import read_fetch_response
        from broker.protocol.kafka_codec import Reader

        r = Reader(frame)
        r.int32()
        return read_fetch_response(11, r)[1][0][1][0]

    def fetch(self, *args, **kwargs):
        with connect(self.port) as s:
            s.sendall(self.fetch_frame(*args, **kwargs))
            return self.fetch_result(recv_frame(s))


@pytest.fixture()
def data(tmp_path):
    dp = DataPlane(tmp_path)
    yield dp
    dp.close()


def test_delayed_fetch_woken_by_follower_progress_and_answered_in_order(data):
    """A consumer's long-poll Fetch on connection A waits; a produce (acks=1) appends but the HW
    holds (follower 2 has not fetched); follower 2's Fetch on C moves the HW, which completes A's
    fetch long before max_wait, and A's pipelined ApiVersions is answered after it."""
    from tests.unit.test_partition_log import make_batch, values_in

    a, c = connect(data.port), connect(data.port)
    a.settimeout(15)
    started = time.monotonic()
    a.sendall(
        data.fetch_frame(-1, "orders", 0, 0, max_wait_ms=10_000)
        + request(18, 0, 999, b"", flexible=False)
    )
    assert data.produce("orders", 0, make_batch([b"p", b"q"]), acks=1) == (0, 0)
    assert data.rm.get_by_name("orders", 0).high_watermark == 0
    c.sendall(
        data.fetch_frame(2, "orders", 0, 2, max_wait_ms=10_000)
    )  # follower 2 is at 2 (and long-polls)
    part = data.fetch_result(recv_frame(a))
    assert time.monotonic() - started < 8  # woken, not timed out
    assert (part.error_code, part.high_watermark) == (0, 2)
    assert values_in(part.records) == [(0, b"p"), (1, b"q")]
    assert struct.unpack_from(">ih", recv_frame(a)) == (999, 0)
    a.close()
    c.close()


def test_produce_purgatory_timeout_min_isr_and_partition_errors(data):
    from kraft.records import RESOURCE_TOPIC, ConfigRecord
    from tests.unit.test_partition_log import make_batch

    batch = make_batch([b"v"])
    started = time.monotonic()
    assert data.produce("orders", 0, batch, acks=-1, timeout_ms=300) == (7, -1)  # REQUEST_TIMED_OUT
    assert time.monotonic() - started < 5
    plog = data.rm.get_by_name("orders", 0).log
    assert plog.log_end_offset == 1  # appended, only not acknowledged (as Kafka)
    assert data.produce("orders", 0, batch, acks=1) == (0, 1)
    assert data.produce("orders", 0, batch, acks=2) == (21, -1)  # INVALID_REQUIRED_ACKS
    data.step(ConfigRecord(RESOURCE_TOPIC, "orders", "min.insync.replicas", "3"))
    assert data.produce("orders", 0, batch, acks=-1) == (19, -1)  # NOT_ENOUGH_REPLICAS
    assert data.produce("orders", 2, batch, acks=1) == (6, -1)  # follower here
    assert data.produce("orders", 1, batch, acks=1) == (6, -1)  # no replica here
    assert data.produce("nope", 0, batch, acks=1) == (3, -1)  # UNKNOWN_TOPIC_OR_PARTITION
    assert data.produce("orders", 0, b"\x00" * 70, acks=1) == (2, -1)  # CORRUPT_MESSAGE
    assert plog.log_end_offset == 2
    import datetime

    with connect(data.port) as s:  # acks=0: appended, no response; the next request is answered
        s.sendall(
            data.frame(
                0,
                8,
                {
                    "transactional_id": None,
                    "acks": 0,
                    "timeout": datetime.timedelta(seconds=5),
                    "topic_data": [
                        {"name": "orders", "partition_data": [{"index": 0, "records": batch}]}
                    ],
                },
            )
            + request(18, 0, 4242, b"", flexible=False)
        )
        assert struct.unpack_from(">ih", recv_frame(s)) == (4242, 0)
    assert plog.log_end_offset == 3


def test_fetch_epoch_and_range_errors_and_list_offsets(data):
    from kio.index import load_response_schema
    from kio.serial import entity_reader

    from tests.unit.test_partition_log import make_batch

    data.produce("orders", 0, make_batch([b"a", b"b", b"c"]), acks=1)
    data.fetch(2, "orders", 0, 3)  # follower 2 caught up: HW 3
    assert data.fetch(-1, "orders", 0, 0, epoch=5).error_code == 0
    assert data.fetch(-1, "orders", 0, 0, epoch=4).error_code == 74  # FENCED_LEADER_EPOCH
    assert data.fetch(-1, "orders", 0, 0, epoch=6).error_code == 75  # UNKNOWN_LEADER_EPOCH
    assert data.fetch(-1, "orders", 0, 4).error_code == 1  # OFFSET_OUT_OF_RANGE
    assert data.fetch(-1, "orders", 2, 0).error_code == 6  # NOT_LEADER_OR_FOLLOWER
    with connect(data.port) as s:
        s.sendall(
            data.frame(
                2,
                7,
                {
                    "replica_id": -1,
                    "isolation_level": 0,
                    "topics": [
                        {
                            "name": "orders",
                            "partitions": [
                                {"partition_index": 0, "current_leader_epoch": -1, "timestamp": t}
                                for t in (-2, -1, 0)
                            ],
                        }
                    ],
                },
            )
        )
        resp, _ = entity_reader(load_response_schema(2, 7))(recv_frame(s), 5)
    assert [(p.error_code.value, p.offset) for p in resp.topics[0].partitions] == [
        (0, 0),
        (0, 3),
        (0, 0),
    ]
    with connect(data.port) as s:
        s.sendall(
            data.frame(
                23,
                4,
                {
                    "replica_id": -1,
                    "topics": [
                        {
                            "topic": "orders",
                            "partitions": [
                                {"partition": 0, "current_leader_epoch": 5, "leader_epoch": 5}
                            ],
                        }
                    ],
                },
            )
        )
        resp, _ = entity_reader(load_response_schema(23, 4))(recv_frame(s), 5)
    p = resp.topics[0].partitions[0]
    assert (p.error_code.value, p.leader_epoch, p.end_offset) == (0, 5, 3)


def test_fetch_session_over_the_wire(data):
    """KIP-227 against the listener: a full fetch opens a session, incremental fetches answer
    only partitions with news (an error always), a wrong epoch is 71, an unknown session 70."""
    from broker.protocol.data_codec import (
        FetchPartition,
        FetchRequest,
        frame_request,
        read_fetch_session_response,
        write_fetch_request,
    )
    from broker.protocol.kafka_codec import Reader
    from tests.unit.test_partition_log import make_batch, values_in

    def session_fetch(s, sid, epoch, parts):
        data.corr += 1
        topics = (
            [("orders", [FetchPartition(p, -1, 0, 0, 1 << 20) for p in parts])] if parts else []
        )
        req = FetchRequest(-1, 0, 1, 1 << 20, 0, topics, sid, epoch)
        s.sendall(frame_request(1, 11, data.corr, "t", write_fetch_request(req)))
        r = Reader(recv_frame(s))
        r.int32()
        err, got, results = read_fetch_session_response(11, r)
        return err, got, {p.partition: p for _, ps in results for p in ps}

    with connect(data.port) as s:
        s.settimeout(15)
        err, sid, parts = session_fetch(s, 0, 0, [0, 2])
        assert err == 0 and sid > 0 and sorted(parts) == [0, 2] and parts[2].error_code == 6
        err, got, parts = session_fetch(s, sid, 1, [])
        assert (err, got, sorted(parts)) == (0, sid, [2])  # orders-0 has nothing new
        data.produce("orders", 0, make_batch([b"n"]), acks=1)
        data.fetch(2, "orders", 0, 1)  # follower 2 caught up: HW 1
        err, got, parts = session_fetch(s, sid, 2, [])
        assert (err, got) == (0, sid) and values_in(parts[0].records) == [(0, b"n")]
        assert session_fetch(s, sid, 2, [])[:2] == (71, 0)  # INVALID_FETCH_SESSION_EPOCH
        assert session_fetch(s, sid + 1, 3, [])[:2] == (70, 0)  # FETCH_SESSION_ID_NOT_FOUND


@pytest.mark.parametrize("version", [0, 1, 3, 4])
def test_find_coordinator_says_not_available(listener, version):
    from kio.index import load_response_schema
    from kio.serial import entity_reader

    _, port = listener
    key = uvarint(6) + b"group" if version >= 3 else struct.pack(">h", 5) + b"group"
    body = {
        0: key,
        1: key + b"\x00",
        3: key + b"\x00\x00",
        4: b"\x00" + uvarint(2) + uvarint(6) + b"group" + b"\x00",
    }[version]
    with connect(port) as s:
        s.sendall(request(10, version, 5, body, flexible=version >= 3))
        frame = recv_frame(s)
    head = 5 if version >= 3 else 4
    resp, _ = entity_reader(load_response_schema(10, version))(frame, head)
    err = resp.coordinators[0].error_code if version >= 4 else resp.error_code
    assert err.value == 15  # COORDINATOR_NOT_AVAILABLE


def test_idle_slow_and_surplus_connections_are_closed():
    """connections.max.idle.ms, request.read.timeout.ms and max.connections: an idle connection
    and a byte-at-a-time sender are closed, a connection over the cap is refused, and a normal
    client is served throughout."""
    cache = MetadataCache(CLUSTER_ID)
    lt = ListenerThread(cache, idle_timeout_s=1.0, read_timeout_s=1.0, max_connections=3)
    port = lt.start()
    cache.set_image(build_image(port))
    try:
        idle = connect(port)
        slow = connect(port)
        slow.sendall(request(18, 0, 1, b"", flexible=False)[:6])  # a frame started, never finished
        assert is_closed(idle) and is_closed(slow)
        held = [connect(port) for _ in range(3)]
        extra = connect(port)
        assert is_closed(extra)  # over max.connections
        held[0].sendall(request(18, 0, 5, b"", flexible=False))
        assert struct.unpack_from(">i", recv_frame(held[0]))[0] == 5
        for s in held:
            s.close()
    finally:
        lt.stop()
