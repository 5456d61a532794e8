"""Broker-side topic conveniences with real clients against 1 controller + 1 broker:
``auto.create.topics.enable`` (kcat and kafka-python produce to missing topics; the topic then
exists with ``num.partitions`` and ``default.replication.factor`` and the metadata log says
``auto-create``), and a client that asks not to auto-create gets none."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.harness import LocalCluster, kraft, kraft_json, poll
from tests.integration.test_produce_fetch import bootstrap, broker_state, consume_all

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # Admin clients here are anonymous on a PLAINTEXT listener: the cluster runs without
    # controller RPC authentication (test_secure_defaults covers the authenticated path).
    c = LocalCluster(tmp_path_factory.mktemp("topicadmin") / "cluster").up(
        1, 1, "--fsync", "never", "--no-auth"
    )
    try:
        b = c.meta["brokers"][0]
        poll(lambda: broker_state(b)["state"] == "RUNNING", 60, what="broker RUNNING")
        yield c
    finally:
        c.down()


def _topic(c: LocalCluster, name: str) -> dict | None:
    topics = kraft_json("topics", "list", "--cluster", str(c.dir))
    items = topics["topics"] if isinstance(topics, dict) else topics
    return next((t for t in items if (t.get("name") if isinstance(t, dict) else t) == name), None)


def _log_lines(c: LocalCluster, needle: str) -> list[str]:
    out = kraft("log", "dump", str(c.controller(1)["metadata_dir"])).stdout
    return [line for line in out.splitlines() if needle in line]


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_produces_to_a_missing_topic_which_is_auto_created(cluster):
    proc = subprocess.run(
        ["kcat", "-P", "-b", bootstrap(cluster), "-t", "auto-kcat"],
        input=b"one\ntwo\nthree\n",
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    desc = kraft_json("topics", "describe", "auto-kcat", "--cluster", str(cluster.dir))
    (topic,) = desc["topics"]
    assert len(topic["partitions"]) == 1  # num.partitions
    assert all(len(p["replicas"]) == 1 for p in topic["partitions"])  # default.replication.factor
    assert sorted(consume_all(bootstrap(cluster), "auto-kcat", 1)) == [b"one", b"three", b"two"]
    lines = _log_lines(cluster, "name=auto-kcat")
    assert lines and all("CreateTopics (auto-create)" in line for line in lines), lines


def test_kafka_python_producer_auto_creates_and_opt_out_is_respected(cluster):
    from kafka import KafkaConsumer, KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap(cluster))
    producer.send("auto-kpy", b"hello").get(timeout=60)
    producer.close()
    desc = kraft_json("topics", "describe", "auto-kpy", "--cluster", str(cluster.dir))
    assert len(desc["topics"][0]["partitions"]) == 1
    consumer = KafkaConsumer(bootstrap_servers=bootstrap(cluster), allow_auto_create_topics=False)
    try:
        assert not consumer.partitions_for_topic("never-made")
    finally:
        consumer.close()
    assert not _log_lines(cluster, "name=never-made")


def test_confluent_alter_configs_replaces_the_whole_set(cluster):
    from confluent_kafka.admin import AdminClient, ConfigResource

    kraft("topics", "create", "cfg", "--cluster", str(cluster.dir))
    kraft(
        "configs",
        "alter",
        "--topic",
        "cfg",
        "--set",
        "retention.ms=100000",
        "--set",
        "max.message.bytes=5000",
        "--cluster",
        str(cluster.dir),
    )
    admin = AdminClient({"bootstrap.servers": bootstrap(cluster)})
    resource = ConfigResource("topic", "cfg", set_config={"retention.ms": "200000"})
    for future in admin.alter_configs([resource]).values():
        future.result(timeout=30)
    dynamic = {
        c["name"]: c["value"]
        for c in kraft_json("configs", "describe", "--topic", "cfg", "--cluster", str(cluster.dir))[
            "resources"
        ][0]["configs"]
        if c.get("source") == "dynamic"
    }
    assert dynamic == {"retention.ms": "200000"}  # max.message.bytes was not given: deleted
    lines = _log_lines(cluster, "resource_name=cfg name=max.message.bytes")
    assert lines and "AlterConfigs (user-request)" in lines[-1], lines
    bad = ConfigResource("topic", "cfg", set_config={"retention.ms": "not-a-number"})
    with pytest.raises(Exception) as e:
        for future in admin.alter_configs([bad]).values():
            future.result(timeout=30)
    assert "retention.ms" in str(e.value)


def test_delete_records_from_admin_client_and_cli(cluster):
    from confluent_kafka import Producer, TopicPartition
    from confluent_kafka.admin import AdminClient

    kraft("topics", "create", "trim", "--cluster", str(cluster.dir))
    producer = Producer({"bootstrap.servers": bootstrap(cluster), "acks": "all"})
    for i in range(100):
        producer.produce("trim", f"r-{i}".encode())
    assert producer.flush(30) == 0
    admin = AdminClient({"bootstrap.servers": bootstrap(cluster)})
    (future,) = admin.delete_records([TopicPartition("trim", 0, 40)]).values()
    assert future.result(timeout=30).low_watermark == 40
    got = consume_all(bootstrap(cluster), "trim", 1)
    assert got == [f"r-{i}".encode() for i in range(40, 100)]
    out = kraft_json(
        "topics",
        "delete-records",
        "--topic",
        "trim",
        "--partition",
        "0",
        "--offset",
        "70",
        "--cluster",
        str(cluster.dir),
    )
    assert out["low_watermark"] == 70 and out["error_code"] == 0, out
    assert consume_all(bootstrap(cluster), "trim", 1)[0] == b"r-70"
    bad = kraft(
        "topics",
        "delete-records",
        "--topic",
        "trim",
        "--partition",
        "0",
        "--offset",
        "500",
        "--cluster",
        str(cluster.dir),
        check=False,
    )
    assert bad.returncode == 1 and "OFFSET_OUT_OF_RANGE" in bad.stderr, bad
    text = kraft(
        "topics",
        "delete-records",
        "--topic",
        "trim",
        "--partition",
        "0",
        "--offset",
        "-1",
        "--cluster",
        str(cluster.dir),
    ).stdout
    assert "log start offset is now 100" in text
